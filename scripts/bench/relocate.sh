#!/usr/bin/env bash
# btrkit's relocation against the kernel's: a shrink to the minimum and a
# profile conversion, each on fresh copies of one image, side by side.
#
# usage: scripts/bench/relocate.sh DIR [RUNS] [SHRINK_TO]
#
# Builds once, through the kernel (mkfs.btrfs defaults, a loop mount):
#   DIR/shrink.img   4 GiB holding 1 GiB of files (64 KiB - 8 MiB) at its
#                    far end (written after 2 GiB of filler, which is
#                    then deleted), a snapshot of it all, a few reflinks
#   DIR/conv1.img + DIR/conv2.img   two devices of 3 GiB (data single,
#                    metadata raid1) holding 1 GiB of such files
# Then, each run on fresh sparse copies whose page cache is dropped:
#   shrink:  to SHRINK_TO (default 2048m: the smallest of 256 MiB steps
#            both the kernel and btrkit reach; all the files move):
#            btrkit filesystem resize SIZE IMG   against
#            mount; btrfs filesystem resize MIN MNT; umount (the kernel's
#            time includes the unmount, whose commit makes it durable)
#   convert: btrkit balance start -dconvert=raid1 -mconvert=raid1 A B  against
#            mount; btrfs balance start -dconvert=raid1 -mconvert=raid1 MNT; umount
# And the I/O floor of either: 1 GiB of random bytes copied, source cold,
# copy flushed (dd bs=4M conv=fdatasync): what moving 1 GiB of data costs
# this disk at the least.
# Prints wall seconds, and "(NOT CLEAN)" when btrfs check finds a result
# damaged. Needs root, loop devices, btrfs-progs, python3, a release build.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:?usage: relocate.sh DIR [RUNS]}
runs=${2:-3}
target=${3:-2048m}
mkdir -p "$dir" "$dir/mnt"
cargo build --release -q -p btrkit
btrkit=$PWD/target/release/btrkit
mnt=$dir/mnt

fill() { # fill MNT GIB: files of 64 KiB - 8 MiB, GIB in all
    python3 - "$1" "$2" <<'PY'
import os, random, sys
root, gib = sys.argv[1], float(sys.argv[2])
r = random.Random(7)
total, i = 0, 0
os.makedirs(os.path.join(root, "files"), exist_ok=True)
while total < gib * (1 << 30):
    n = r.randint(64 << 10, 8 << 20)
    with open(os.path.join(root, "files", "f%05d" % i), "wb") as f:
        f.write(os.urandom(n))
    total += n; i += 1
os.sync()
PY
}

if [ ! -f "$dir/shrink.img" ]; then
    truncate -s 4G "$dir/shrink.img"
    mkfs.btrfs -q -f "$dir/shrink.img"
    mount -o loop "$dir/shrink.img" "$mnt"
    dd if=/dev/zero of="$mnt/filler" bs=16M count=128 status=none; sync
    fill "$mnt" 1
    rm "$mnt/filler"; sync
    btrfs -q subvolume snapshot "$mnt" "$mnt/snap"
    for f in $(ls "$mnt/files" | head -20); do cp --reflink=always "$mnt/files/$f" "$mnt/files/$f.clone"; done
    # The cleaner removes the filler's emptied block groups.
    btrfs filesystem sync "$mnt"; sleep 35; btrfs filesystem sync "$mnt"
    umount "$mnt"
fi
if [ ! -f "$dir/conv1.img" ]; then
    truncate -s 3G "$dir/conv1.img" "$dir/conv2.img"
    mkfs.btrfs -q -f -d single -m raid1 "$dir/conv1.img" "$dir/conv2.img"
    l2=$(losetup -f --show "$dir/conv2.img")
    mount -o loop,device="$l2" "$dir/conv1.img" "$mnt"
    fill "$mnt" 1
    umount "$mnt"; losetup -d "$l2"
fi

w=$dir/work.img; w2=$dir/work2.img
cleanup() {
    umount "$mnt" 2>/dev/null || true
    for f in "$w" "$w2"; do
        for l in $(losetup -j "$f" -O NAME -n 2>/dev/null); do losetup -d "$l"; done
    done
    rm -f "$w" "$w2" "$dir/floor.src" "$dir/floor.dst"
}
trap cleanup EXIT
drop() { python3 -c "import os,sys
for p in sys.argv[1:]:
    f=os.open(p,os.O_RDONLY); os.posix_fadvise(f,0,0,os.POSIX_FADV_DONTNEED)" "$@"; }
fresh1() { rm -f "$w"; cp --sparse=always "$dir/shrink.img" "$w"; sync; drop "$w"; }
fresh2() { rm -f "$w" "$w2"; cp --sparse=always "$dir/conv1.img" "$w"; cp --sparse=always "$dir/conv2.img" "$w2"; sync; drop "$w" "$w2"; }
now() { date +%s.%N; }
since() { echo "$(now) - $1" | bc; }
verdict() { btrfs check --readonly "$1" >/dev/null 2>&1 || echo "(NOT CLEAN)"; }

fresh1
mount -o loop,ro "$w" "$mnt"
echo "min-dev-size: $(btrfs inspect-internal min-dev-size "$mnt"); shrinking to $target"
umount "$mnt"
min=$target
floor() {
    [ -f "$dir/floor.src" ] || dd if=/dev/urandom of="$dir/floor.src" bs=4M count=256 status=none
    sync; drop "$dir/floor.src"; rm -f "$dir/floor.dst"
    local s; s=$(now); dd if="$dir/floor.src" of="$dir/floor.dst" bs=4M conv=fdatasync status=none; since "$s"
}
echo "run btrkit-shrink(s) kernel-shrink(s) btrkit-convert(s) kernel-convert(s) floor-1GiB-copy(s)"
for r in $(seq "$runs"); do
    fresh1; s=$(now); "$btrkit" filesystem resize "$min" "$w" >/dev/null; a="$(since "$s")$(verdict "$w")"
    fresh1; s=$(now); mount -o loop "$w" "$mnt"; btrfs filesystem resize "$min" "$mnt" >/dev/null; umount "$mnt"
    b="$(since "$s")$(verdict "$w")"
    fresh2; s=$(now); "$btrkit" balance start -dconvert=raid1 -mconvert=raid1 "$w" "$w2" >/dev/null
    c=$(since "$s")
    l1=$(losetup -f --show "$w"); l=$(losetup -f --show "$w2")
    btrfs check --readonly "$l1" >/dev/null 2>&1 || c="$c(NOT CLEAN)"; losetup -d "$l1" "$l"
    fresh2; s=$(now); l=$(losetup -f --show "$w2"); mount -o loop,device="$l" "$w" "$mnt"
    btrfs balance start -dconvert=raid1 -mconvert=raid1 "$mnt" >/dev/null; umount "$mnt"
    d=$(since "$s"); losetup -d "$l"
    echo "$r $a $b $c $d $(floor)"
done
