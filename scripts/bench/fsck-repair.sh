#!/usr/bin/env bash
# btrkit-fsck --repair against btrfs check --repair --clear-space-cache v2
# on the 100,000-file image, whose free space tree has the stale entries
# every mkfs.btrfs before 6.3 leaves.
#
# usage: scripts/bench/fsck-repair.sh DIR [RUNS]
#        COLD=image scripts/bench/fsck-repair.sh DIR [RUNS]
#
# Builds DIR/repair.img once (tests/scripts/make-bench-image.sh: mkfs.btrfs
# defaults, filled through the kernel), then times, cold (a fresh sparse
# copy of the image and every cache dropped before each run; with
# COLD=image only the image's pages are dropped, the programs stay cached,
# as the other fsck benchmarks run), one run of each in turn:
#   btrkit-fsck --repair --yes IMG       check, repair in one commit, check again
#   btrkit-fsck --repair --yes --clear-space-cache v2 IMG
#       the free space tree rebuilt from the extent tree, nothing checked
#   btrfs check --repair --force --clear-space-cache v2 IMG   (6.14)
#       which only drops the free space tree (the kernel rebuilds it at the
#       next mount) and checks nothing
#   the same followed by btrfs check --readonly IMG (6.14)
#   btrfs check --repair --force IMG (6.14), btrfs-progs' full repair (it
#       checks everything and repairs what it finds), followed by btrfs
#       check --readonly IMG (6.14): repaired and verified, the same work as
#       btrkit's full run (check, repair, check again)
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
fresh() {
    rm -f "$w"; cp --sparse=always "$img" "$w"; sync
    if [ "${COLD:-all}" = image ]; then
        python3 -c "import os,sys;f=os.open(sys.argv[1],os.O_RDONLY);os.posix_fadvise(f,0,0,os.POSIX_FADV_DONTNEED)" "$w"
    else
        echo 3 > /proc/sys/vm/drop_caches
    fi
}
now() { date +%s.%N; }
verdict() { "$new" check --readonly "$w" >/dev/null 2>&1 || echo "(NOT CLEAN)"; }
echo "cold: ${COLD:-all}"
echo "run btrkit-repair(s) btrkit-clear-v2(s) progs-clear(s) progs-clear+check(s) progs-repair+check(s)"
for r in $(seq "$runs"); do
    fresh; s=$(now); "$fsck" --repair --yes "$w" >/dev/null || [ $? = 1 ]; e=$(now)
    a="$(echo "$e - $s" | bc)$(verdict)"
    fresh; s=$(now); "$fsck" --repair --yes --clear-space-cache v2 "$w" >/dev/null; e=$(now)
    b="$(echo "$e - $s" | bc)$(verdict)"
    fresh; s=$(now); "$new" check --repair --force --clear-space-cache v2 "$w" >/dev/null 2>&1; m=$(now)
    "$new" check --readonly "$w" >/dev/null 2>&1 || m="$m(NOT CLEAN)"; e=$(now)
    c="$(echo "$m - $s" | bc) $(echo "$e - $s" | bc)"
    fresh; s=$(now); "$new" check --repair --force "$w" >/dev/null 2>&1 || true
    "$new" check --readonly "$w" >/dev/null 2>&1 || s="$s" ; e=$(now)
    d="$(echo "$e - $s" | bc)$(verdict)"
    echo "$r $a $b $c $d"
done
