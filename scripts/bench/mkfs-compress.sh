#!/usr/bin/env bash
# btrkit-mkfs against mkfs.btrfs 6.14 with --compress zstd and --subvol.
#
# usage: scripts/bench/mkfs-compress.sh DIR [RUNS] [NFILES] [TOTAL_MB] [shrink]
#
# Makes DIR/src-NFILES once (scripts/bench/make-rootdir-source.py ... text:
# NFILES files of compressible text in 100 directories, TOTAL_MB in all;
# defaults 20,000 and 200), then times, cold (caches dropped before each),
# one run of each in turn, each onto a fresh 4 GiB image file:
#   mkfs.btrfs -q -f --compress zstd -u dir000 ... -u dir009 --rootdir SRC
#   btrkit-mkfs -q -f --compress zstd -u dir000 ... -u dir009 --rootdir SRC
# and prints wall seconds and each image's bytes_used (superblock).
# With `shrink`, both run with --shrink onto an image file that does not
# exist yet, and the image file sizes are printed too.
# With SOURCE=mixed in the environment the source is instead
# DIR/mixed-TOTAL_MB (scripts/bench/make-mixed-tree.py: a tree shaped like
# a system directory: text, executable-like and incompressible files from
# empty to 8 MiB, symlinks, hard links, nested directories; NFILES is then
# ignored).
# OURS_EXTRA="--compress-force" (say) is added to btrkit-mkfs's options.
# Needs btrfs-progs 6.14 (../shared/oracle/progs-new.sh) and a release build.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:?usage: mkfs-compress.sh DIR [RUNS] [NFILES] [TOTAL_MB]}
runs=${2:-5}
n=${3:-20000}
mb=${4:-200}
shrink=${5:-}
mkdir -p "$dir"
if [ "${SOURCE:-}" = mixed ]; then
    src=$dir/mixed-$mb
    python3 scripts/bench/make-mixed-tree.py "$src" "$mb"
else
    src=$dir/src-$n
    python3 scripts/bench/make-rootdir-source.py "$src" "$n" "$mb" text
fi
new=$(bash ../shared/oracle/progs-new.sh)
cargo build --release -q -p btrkit-mkfs
ours=$PWD/target/release/btrkit-mkfs
sv=()
for i in 0 1 2 3 4 5 6 7 8 9; do sv+=(-u "dir00$i"); done
cold() { sync; echo 3 > /proc/sys/vm/drop_caches; }
secs() { local s e; s=$(date +%s.%N); "$@" >/dev/null; e=$(date +%s.%N); echo "$e - $s" | bc; }
used() { btrfs inspect-internal dump-super "$1" | awk '/^bytes_used/ {print $2}'; }
fresh() { rm -f "$1"; [ -n "$shrink" ] || truncate -s 4G "$1"; }
extra=()
[ -n "$shrink" ] && extra=(--shrink)
size() { stat -c %s "$1"; }
echo "run progs(s) ours(s) progs_used ours_used progs_file ours_file"
for r in $(seq "$runs"); do
    fresh "$dir/p.img"; cold
    a=$(secs "$new/mkfs.btrfs" -q -f --compress zstd "${extra[@]}" "${sv[@]}" --rootdir "$src" "$dir/p.img")
    fresh "$dir/o.img"; cold
    b=$(secs "$ours" -q -f --compress zstd ${OURS_EXTRA:-} "${extra[@]}" "${sv[@]}" --rootdir "$src" "$dir/o.img")
    echo "$r $a $b $(used "$dir/p.img") $(used "$dir/o.img") $(size "$dir/p.img") $(size "$dir/o.img")"
done
