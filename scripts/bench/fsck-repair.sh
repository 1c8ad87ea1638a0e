#!/usr/bin/env bash
# btrkit-fsck --repair against btrfs check --repair --clear-space-cache v2
# on the 100,000-file image, whose free space tree has the stale entries
# every mkfs.btrfs before 6.3 leaves.
#
# usage: scripts/bench/fsck-repair.sh DIR [RUNS]
#
# Builds DIR/repair.img once (tests/scripts/make-bench-image.sh: mkfs.btrfs
# defaults, filled through the kernel), then times, cold (a fresh sparse
# copy of the image and every cache dropped before each run), one run of
# each in turn:
#   btrkit-fsck --repair --yes IMG       check, repair in one commit, check again
#   btrfs check --repair --force --clear-space-cache v2 IMG   (6.14)
#       which only drops the free space tree (the kernel rebuilds it at the
#       next mount) and checks nothing
#   the same followed by btrfs check --readonly IMG (6.14): repaired and
#       verified, as btrkit's run is
# Prints wall seconds (and the verdict of the image after each). Needs
# root, btrfs-progs 6.2 (the image) and 6.14 (../shared/oracle/progs-new.sh),
# and a release build.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:?usage: fsck-repair.sh DIR [RUNS]}
runs=${2:-5}
mkdir -p "$dir"
tests/scripts/make-bench-image.sh "$dir/repair.img"
cargo build --release -q -p btrkit-fsck
fsck=$PWD/target/release/btrkit-fsck
new=$(bash ../shared/oracle/progs-new.sh)/btrfs
img=$dir/repair.img
w=$dir/work.img
trap 'rm -f "$w"' EXIT
fresh() { rm -f "$w"; cp --sparse=always "$img" "$w"; sync; echo 3 > /proc/sys/vm/drop_caches; }
now() { date +%s.%N; }
echo "run btrkit(s) progs-clear(s) progs-clear+check(s)"
for r in $(seq "$runs"); do
    fresh; s=$(now); "$fsck" --repair --yes "$w" >/dev/null || [ $? = 1 ]; e=$(now)
    a=$(echo "$e - $s" | bc)
    "$new" check --readonly "$w" >/dev/null 2>&1 || a="$a(NOT CLEAN)"
    fresh; s=$(now); "$new" check --repair --force --clear-space-cache v2 "$w" >/dev/null 2>&1; m=$(now)
    "$new" check --readonly "$w" >/dev/null 2>&1 || m="$m(NOT CLEAN)"; e=$(now)
    echo "$r $a $(echo "$m - $s" | bc) $(echo "$e - $s" | bc)"
done
