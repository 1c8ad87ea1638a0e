#!/usr/bin/env bash
# btrkit send and receive against the kernel's btrfs send and btrfs-progs'
# btrfs receive, side by side on one disk.
#
# usage: scripts/bench/send-receive.sh DIR [RUNS]
#
# Builds once, through the kernel (mkfs.btrfs defaults, a loop mount):
# DIR/src.img holding subvolume vol with 100,000 files of 4 KiB in 100
# directories (scripts/bench/mkfiles.c) and its read-only snapshot snap.
# Then, each run, page cache dropped before each timing:
#   send:    btrfs send -f S MNT/snap on a read-only loop mount (mounted
#            before the clock starts)   against
#            btrkit send -f S DIR/src.img /snap
#   receive: of the kernel's stream into a fresh image:
#            mount; btrfs receive -f S MNT; umount (the unmount's commit
#            makes it durable)   against
#            btrkit receive -f S DIR/dst.img / (commits before it ends)
# Each received image is checked by btrfs check; wall seconds printed.
# Needs root, loop devices, btrfs-progs, cc, a release build.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:?usage: send-receive.sh DIR [RUNS]}
runs=${2:-3}
mkdir -p "$dir/mnt"
cargo build --release -q -p btrkit
btrkit=$PWD/target/release/btrkit
mnt=$dir/mnt
if [ ! -f "$dir/src.img" ]; then
    cc -O2 -o "$dir/mkfiles" scripts/bench/mkfiles.c
    truncate -s 8G "$dir/src.img"
    mkfs.btrfs -q -f "$dir/src.img"
    mount -o loop "$dir/src.img" "$mnt"
    btrfs -q subvolume create "$mnt/vol"
    "$dir/mkfiles" "$mnt/vol" 100 1000 4096
    btrfs -q subvolume snapshot -r "$mnt/vol" "$mnt/snap"
    umount "$mnt"
fi
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
t() { local s e; s=$(date +%s.%N); "$@"; e=$(date +%s.%N); echo "$e - $s" | bc; }
fresh() { rm -f "$1"; truncate -s 8G "$1"; mkfs.btrfs -q -f "$1"; }
check() { btrfs check --readonly "$1" >/dev/null 2>&1 || echo " (NOT CLEAN)"; }
for r in $(seq "$runs"); do
    mount -o loop,ro "$dir/src.img" "$mnt"
    drop
    ks=$(t btrfs send -q -f "$dir/k.stream" "$mnt/snap")
    umount "$mnt"
    drop
    bs=$(t "$btrkit" send -q -f "$dir/b.stream" "$dir/src.img" /snap)
    fresh "$dir/kdst.img"
    mount -o loop "$dir/kdst.img" "$mnt"
    drop
    kr=$(t sh -c "btrfs receive -q -f '$dir/k.stream' '$mnt' && umount '$mnt'")
    kc=$(check "$dir/kdst.img")
    fresh "$dir/bdst.img"
    drop
    br=$(t "$btrkit" receive -q -f "$dir/k.stream" "$dir/bdst.img" /)
    bc_=$(check "$dir/bdst.img")
    echo "run $r: send kernel ${ks}s btrkit ${bs}s | receive kernel ${kr}s$kc btrkit ${br}s$bc_ | streams $(stat -c %s "$dir/k.stream") $(stat -c %s "$dir/b.stream") bytes"
done
rm -f "$dir/kdst.img" "$dir/bdst.img" "$dir/k.stream" "$dir/b.stream"
