#!/usr/bin/env bash
# Reading a RAID5 set missing one device and a RAID6 set missing two:
# btrkit-fsck --degraded --check-data-csum (every data sector rebuilt from
# parity where its stripe is gone, and verified) against the kernel's
# degraded read of the same files.
#
# usage: scripts/bench/raid56.sh DIR [RUNS]
#
# Builds once, with mkfs.btrfs and the kernel: DIR/r5-{1,2,3}.img (raid5
# data and metadata) and DIR/r6-{1,2,3,4}.img (raid6), each holding 300 MB
# of files (300 files of 1 MiB of random bytes and 3,000 of 4 KiB to
# 32 KiB). Device 2 of the raid5 set and devices 1 and 3 of the raid6 set
# are left out of every run. Then times, cold (every cache dropped before
# each run), one run of each in turn:
#   kernel: loop devices of the devices left, mount -o degraded,ro,
#           `find -type f -print0 | xargs -0 cat >/dev/null`, umount
#   btrkit-fsck --degraded --check-data-csum DEVICES...
# The mount and unmount are inside the kernel's timing; losetup is not.
# Prints wall seconds per run. Needs root, btrfs-progs and a release build.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:?usage: raid56.sh DIR [RUNS]}
runs=${2:-5}
mkdir -p "$dir/mnt"
mnt=$dir/mnt
cargo build --release -q -p btrkit-fsck
fsck=$PWD/target/release/btrkit-fsck

make_set() { # name n profile
    local name=$1 n=$2 prof=$3 imgs=() loops=() i
    [ -e "$dir/$name.done" ] && return 0
    for i in $(seq "$n"); do
        imgs+=("$dir/$name-$i.img")
        rm -f "$dir/$name-$i.img"
        truncate -s 600M "$dir/$name-$i.img"
    done
    mkfs.btrfs -q -f -d "$prof" -m "$prof" "${imgs[@]}" >/dev/null 2>&1
    for i in "${imgs[@]}"; do loops+=("$(losetup -f --show "$i")"); done
    local opts=""
    for l in "${loops[@]:1}"; do opts="$opts,device=$l"; done
    mount -o "${opts#,}" "${loops[0]}" "$mnt"
    python3 - "$mnt" <<'PY'
import os, sys, random
root = sys.argv[1]
rnd = random.Random(56)
for d in range(10):
    os.makedirs(f"{root}/big{d}")
    for f in range(30):
        with open(f"{root}/big{d}/f{f}", "wb") as fh:
            fh.write(rnd.randbytes(1 << 20))
    os.makedirs(f"{root}/small{d}")
    for f in range(300):
        with open(f"{root}/small{d}/f{f}", "wb") as fh:
            fh.write(rnd.randbytes(4096 * rnd.randint(1, 8)))
PY
    umount "$mnt"
    for l in "${loops[@]}"; do losetup -d "$l"; done
    touch "$dir/$name.done"
}
make_set r5 3 raid5
make_set r6 4 raid6

cold() { sync; echo 3 > /proc/sys/vm/drop_caches; }
secs() { local s e; s=$(date +%s.%N); "$@" >/dev/null; e=$(date +%s.%N); echo "$e - $s" | bc; }
kernel() {
    local opts="degraded,ro" l
    for l in "${@:2}"; do opts="$opts,device=$l"; done
    mount -o "$opts" "$1" "$mnt"
    find "$mnt" -type f -print0 | xargs -0 cat >/dev/null
    umount "$mnt"
}
ours() { "$fsck" --degraded --check-data-csum "$@"; }

for set in r5 r6; do
    if [ "$set" = r5 ]; then left=("$dir/r5-1.img" "$dir/r5-3.img");
    else left=("$dir/r6-2.img" "$dir/r6-4.img"); fi
    loops=()
    for i in "${left[@]}"; do loops+=("$(losetup -f --show "$i")"); done
    echo "$set run kernel(s) btrkit-fsck(s)"
    for r in $(seq "$runs"); do
        cold; a=$(secs kernel "${loops[@]}")
        cold; b=$(secs ours "${left[@]}")
        echo "$set $r $a $b"
    done
    for l in "${loops[@]}"; do losetup -d "$l"; done
done
