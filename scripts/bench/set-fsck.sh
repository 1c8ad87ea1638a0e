#!/usr/bin/env bash
# btrkit-fsck on a filesystem of two devices (RAID1 data and metadata,
# 100,000 files, 1.2 GB of data) against btrfs check and btrfs scrub.
#
# usage: scripts/bench/set-fsck.sh DIR [RUNS]
#
# Builds DIR/a.img + DIR/b.img once (tests/scripts/make-bench-image.sh),
# then times, cold (every cache dropped before each run), side by side:
#   btrkit-fsck --check-mirrors --check-data-csum a.img b.img   (every copy
#       of every tree block and every data sector, on both devices)
#   btrfs check --readonly --check-data-csum (on loop devices)
#   btrfs scrub start -B on the kernel's mount of the set
# Prints wall seconds per run. Needs root, btrfs-progs and a release build.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:?usage: set-fsck.sh DIR [RUNS]}
runs=${2:-5}
mkdir -p "$dir"
MKFS_OPTS="-R ^free-space-tree -d raid1 -m raid1" \
    tests/scripts/make-bench-image.sh --data "$dir/a.img" "$dir/b.img"
cargo build --release -q -p btrkit-fsck
fsck=$PWD/target/release/btrkit-fsck
cold='sync; echo 3 > /proc/sys/vm/drop_caches'

mnt=$(mktemp -d /tmp/btrkit-set-mnt.XXXXXX)
la=$(losetup -f --show "$dir/a.img")
lb=$(losetup -f --show "$dir/b.img")
cleanup() {
    mountpoint -q "$mnt" && umount "$mnt"
    losetup -d "$la" "$lb" 2>/dev/null || true
    rmdir "$mnt" 2>/dev/null || true
}
trap cleanup EXIT

# Interleaved, one cold run of each in turn: this machine's disk speed
# drifts over minutes, so back-to-back batches would compare different
# moments.
t() { sh -c "$cold"; /usr/bin/time -f %e "$@" 2>&1 >/dev/null | tail -1; }
echo "run btrkit-fsck btrfs-check"
for r in $(seq "$runs"); do
    echo "$r $(t "$fsck" --check-mirrors --check-data-csum "$dir/a.img" "$dir/b.img") $(t btrfs check --readonly --check-data-csum "$la")"
done
mount -o "ro,device=$lb" "$la" "$mnt"
echo "run btrkit-fsck btrfs-scrub"
for r in $(seq "$runs"); do
    echo "$r $(t "$fsck" --check-mirrors --check-data-csum "$dir/a.img" "$dir/b.img") $(t btrfs scrub start -B -r "$mnt")"
done
