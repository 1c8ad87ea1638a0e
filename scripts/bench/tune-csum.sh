#!/usr/bin/env bash
# btrkit-tune --csum on the 100,000-file --data image (1.23 GB of file
# data, 3,949 tree blocks) against the physical floor: every allocated
# byte of the image read once, cold, with direct 4 MiB reads, 8 in
# flight (scripts/bench/read-floor.py, the reading pattern of the tool's
# data phase). Optionally against an experimental btrfstune build with
# --csum (stock btrfs-progs builds do not have it): give its path in
# BTRFSTUNE_EXPERIMENTAL (btrfs-progs v6.14 configured with
# --enable-experimental).
#
# usage: scripts/bench/tune-csum.sh DIR [RUNS] [ALGO]   (default 3 runs, xxhash)
#
# Each run starts from a fresh sparse copy of the image, written back and
# dropped from the page cache. Needs root, btrfs-progs, python3 and a
# release build.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:?usage: tune-csum.sh DIR [RUNS] [ALGO]}
runs=${2:-3}
algo=${3:-xxhash}
mkdir -p "$dir"
MKFS_OPTS="-R ^free-space-tree" tests/scripts/make-bench-image.sh --data "$dir/bench-data.img"
cargo build --release -q -p btrkit-tune
tune=$PWD/target/release/btrkit-tune
w=$dir/work.img
trap 'rm -f "$w"' EXIT
fresh() {
    rm -f "$w"; cp --sparse=always "$dir/bench-data.img" "$w"; sync "$w"
    python3 -c "import os,sys;f=os.open(sys.argv[1],os.O_RDONLY);os.posix_fadvise(f,0,0,os.POSIX_FADV_DONTNEED)" "$w"
}
now() { date +%s.%N; }
echo "run floor(s) btrkit-tune(s) btrfstune-experimental(s)"
for r in $(seq "$runs"); do
    fresh; f=$(python3 scripts/bench/read-floor.py "$w" | sed 's/.* in \([0-9.]*\) s/\1/')
    fresh; s=$(now); "$tune" -q --csum "$algo" "$w"; e=$(now); t=$(echo "$e - $s" | bc)
    p=-
    if [ -n "${BTRFSTUNE_EXPERIMENTAL:-}" ]; then
        fresh; s=$(now); "$BTRFSTUNE_EXPERIMENTAL" --csum "$algo" "$w" >/dev/null 2>&1; e=$(now); p=$(echo "$e - $s" | bc)
    fi
    echo "$r $f $t $p"
done
