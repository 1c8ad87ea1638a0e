#!/usr/bin/env bash
# btrkit-tune against btrfstune 6.14 on the 100,000-file image: a new fsid
# (-u) by both, and btrkit-tune -u renewing the subvolume UUIDs as well
# (its default for a clone).
#
# usage: scripts/bench/tune.sh DIR [RUNS]
#
# Builds DIR/tune.img once (tests/scripts/make-bench-image.sh: mkfs.btrfs
# defaults, 100,000 small files filled through the kernel), then times,
# each on a fresh sparse copy whose page cache is dropped (the programs
# stay cached), one run of each in turn:
#   btrkit-tune -q -u --keep-subvol-uuids IMG   what btrfstune -u does
#   btrkit-tune -q -u IMG                       the same, subvolume UUIDs too
#   btrfstune -f -u IMG (6.14)
#   scripts/bench/tune-u-floor.py IMG   the I/O any crash-safe -u must do
# Prints wall seconds, and "(NOT CLEAN)" when btrfs check 6.14 finds the
# result damaged. Needs root, btrfs-progs 6.2 (the image) and 6.14
# (../shared/oracle/progs-new.sh), python3 and a release build.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:?usage: tune.sh DIR [RUNS]}
runs=${2:-5}
mkdir -p "$dir"
tests/scripts/make-bench-image.sh "$dir/tune.img"
cargo build --release -q -p btrkit-tune
tune=$PWD/target/release/btrkit-tune
newdir=$(bash ../shared/oracle/progs-new.sh)
img=$dir/tune.img
w=$dir/work.img
trap 'rm -f "$w"' EXIT
fresh() {
    rm -f "$w"; cp --sparse=always "$img" "$w"; sync
    python3 -c "import os,sys;f=os.open(sys.argv[1],os.O_RDONLY);os.posix_fadvise(f,0,0,os.POSIX_FADV_DONTNEED)" "$w"
}
now() { date +%s.%N; }
verdict() { "$newdir/btrfs" check --readonly "$w" >/dev/null 2>&1 || echo "(NOT CLEAN)"; }
timed() { local s e; s=$(now); "$@" >/dev/null 2>&1; e=$(now); echo "$e - $s" | bc; }
echo "run btrkit-u(s) btrkit-u+subvols(s) btrfstune-u(s) io-floor(s)"
for r in $(seq "$runs"); do
    fresh; a="$(timed "$tune" -q -u --keep-subvol-uuids "$w")$(verdict)"
    fresh; b="$(timed "$tune" -q -u "$w")$(verdict)"
    fresh; c="$(timed "$newdir/btrfstune" -f -u "$w")$(verdict)"
    fresh; f=$(python3 scripts/bench/tune-u-floor.py "$w" --btrfs "$newdir/btrfs" | sed -n 's/^floor \([0-9.]*\) s$/\1/p')
    echo "$r $a $b $c $f"
done
