#!/usr/bin/env bash
# --csum to every algorithm and back on the 100,000-file --data image
# (1.23 GB of data): after each conversion the kernel reads every file
# back equal (md5 of every file against the list taken before), and
# btrkit-fsck --check-data-csum and btrfs check --check-data-csum (6.14,
# which knows every algorithm) find it clean. On demand (a few minutes):
#   scripts/tune-csum-roundtrip.sh DIR
# Needs root, loop devices, btrfs-progs 6.2 and 6.14, a release build.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: tune-csum-roundtrip.sh DIR}
mkdir -p "$dir"
MKFS_OPTS="-R ^free-space-tree" tests/scripts/make-bench-image.sh --data "$dir/bench-data.img"
cargo build --release -q -p btrkit-tune -p btrkit-fsck
bin=$PWD/target/release
new=$(bash ../shared/oracle/progs-new.sh)/btrfs
w=$dir/roundtrip.img
mnt=$dir/mnt
mkdir -p "$mnt"
trap 'umount "$mnt" 2>/dev/null || true; rm -f "$w"' EXIT
cp --sparse=always "$dir/bench-data.img" "$w"
sums() { mount -o ro,loop "$w" "$mnt"; (cd "$mnt" && find . -type f -print0 | sort -z | xargs -0 md5sum); umount "$mnt"; }
sums > "$dir/before.md5"
for algo in xxhash sha256 blake2 crc32c; do
    s=$(date +%s.%N)
    "$bin/btrkit-tune" -q --csum "$algo" "$w"
    e=$(date +%s.%N)
    "$bin/btrkit-fsck" --check-data-csum "$w" >/dev/null
    "$new" check --readonly --check-data-csum "$w" >/dev/null 2>&1
    sums > "$dir/after.md5"
    cmp "$dir/before.md5" "$dir/after.md5"
    echo "$algo: converted in $(echo "$e - $s" | bc) s; btrkit-fsck and btrfs check 6.14 --check-data-csum clean; kernel read every file back equal"
done
