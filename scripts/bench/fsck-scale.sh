#!/usr/bin/env bash
# btrkit-fsck at scale: a filesystem of N small files, checked cold by
# btrkit-fsck, btrfs check 6.2 and 6.14, and btrfsutils' btrfs check.
#
# usage: scripts/bench/fsck-scale.sh DIR FILES [RUNS]
#
#   FILES   100000, 1000000 or 10000000 (any multiple of 10,000)
#
# Makes DIR/files-FILES.img once with btrkit-shell (mkfs defaults, then
# FILES/10,000 directories of 10,000 files of 100 bytes each, written with
# `writefiles`, then `sync`; 1M files take about 10 s, 10M about 2 min and
# 5.6 GB of metadata). Then, caches of the image dropped before every run,
# hyperfine -N -r RUNS over the tools present, and one run of each under
# /usr/bin/time for peak RSS. BTRKIT_PROF=1 per-phase timings of one cold
# btrkit-fsck run are printed last.
#
# btrfsutils is crates.io's btrfs-cli, installed with
#   apt-get install -y libclang-dev
#   cargo install btrfs-cli --version 0.13.0 --no-default-features --root DIR
# and found as $BTRFSUTILS (default DIR/btrfsutils/bin/btrfs). btrfs check
# 6.14 comes from ../shared/oracle/progs-new.sh. Needs root (dropping caches).
# SKIP_SLOW=1 leaves out the other tools (at 10M files btrfs check takes
# minutes and gigabytes). MAKER=kernel makes DIR/kfiles-FILES.img the way
# users make theirs instead: mkfs.btrfs (defaults) and the same files
# written by the kernel on a loop mount (scripts/bench/mkfiles.c), then
# unmounted.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:?usage: fsck-scale.sh DIR FILES [RUNS]}
files=${2:?usage: fsck-scale.sh DIR FILES [RUNS]}
runs=${3:-5}
[ $((files % 10000)) = 0 ] || { echo "fsck-scale: FILES must be a multiple of 10000" >&2; exit 2; }
mkdir -p "$dir"
cargo build --release -q -p btrkit-fsck -p btrkit-shell
fsck=$PWD/target/release/btrkit-fsck
img=$dir/files-$files.img
if [ "${MAKER:-btrkit}" = kernel ]; then
    img=$dir/kfiles-$files.img
    if [ ! -f "$img" ]; then
        cc -O2 -o "$dir/mkfiles" scripts/bench/mkfiles.c
        truncate -s $(( (files / 1000000 + 1) * 16 ))G "$img.partial"
        mkfs.btrfs -q -f "$img.partial"
        mnt=$(mktemp -d)
        start=$(date +%s.%N)
        mount -o loop "$img.partial" "$mnt"
        "$dir/mkfiles" "$mnt" $((files / 10000)) 10000 100 || { umount "$mnt"; exit 1; }
        umount "$mnt"
        rmdir "$mnt"
        mv "$img.partial" "$img"
        echo "made $img through the kernel: $files files in $(echo "$(date +%s.%N) - $start" | bc) s"
    fi
fi
if [ ! -f "$img" ]; then
    dirs=$((files / 10000))
    scn=$dir/files-$files.scn
    { echo "fssize $(( (files / 1000000 + 1) * 16 ))G"
      for i in $(seq 0 $((dirs - 1))); do
          printf 'mkdir /d%04d\nwritefiles /d%04d 10000 100 none\n' "$i" "$i"
      done
      echo sync; } > "$scn"
    start=$(date +%s.%N)
    target/release/btrkit-shell -q "$img.partial" "$scn"
    mv "$img.partial" "$img"
    echo "made $img: $files files in $(echo "$(date +%s.%N) - $start" | bc) s"
fi
cold="sh $dir/cold.sh $img"
echo 'python3 -c "import os,sys;f=os.open(sys.argv[1],os.O_RDONLY);os.posix_fadvise(f,0,0,os.POSIX_FADV_DONTNEED)" "$1"' > "$dir/cold.sh"
cmds=("$fsck $img")
if [ "${SKIP_SLOW:-0}" != 1 ]; then
    cmds+=("btrfs check --readonly $img")
    new=$(bash ../shared/oracle/progs-new.sh 2>/dev/null)/btrfs || true
    [ -x "$new" ] && cmds+=("$new check --readonly $img")
    utils=${BTRFSUTILS:-$dir/btrfsutils/bin/btrfs}
    [ -x "$utils" ] && cmds+=("$utils check --readonly $img")
fi
hyperfine -N -i -r "$runs" --prepare "$cold" --output=null "${cmds[@]}"
for c in "${cmds[@]}"; do
    $cold
    /usr/bin/time -f "peak RSS %M KiB, %e s: $c" $c >/dev/null 2>/tmp/fsck-scale.err || true
    tail -n 1 /tmp/fsck-scale.err
done
$cold
BTRKIT_PROF=1 "$fsck" "$img" 2>&1 >/dev/null | grep -E "walked|joined|phase" || true
