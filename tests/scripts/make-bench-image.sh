#!/usr/bin/env bash
# Build the 100,000-file benchmark image.
#
# usage: make-bench-image.sh [--data] [--force] IMAGE [IMAGE...]
#
#   IMAGE     path of the image to create (a 4 GiB sparse file); several
#             make one filesystem on several devices (give the profiles in
#             MKFS_OPTS, e.g. MKFS_OPTS="-d raid1 -m raid1")
#   --data    also write ~1.2 GB of file data (4-20 KiB per file, random bytes),
#             for `fsck --check-data-csum` benchmarks; without it files hold a
#             few bytes (inline), except one in a hundred of 4-64 KiB
#   --force   rebuild even if IMAGE is already a finished bench image
#
# Layout: 100 directories d000..d099 of 1000 files each (f00000..f99999).
# The image is made by mkfs.btrfs (defaults, plus $MKFS_OPTS if set) and
# populated through a kernel loop mount, then unmounted.
#
# Idempotent: the image is built as IMAGE.partial and renamed when complete,
# with label btrkit-bench-100k (or btrkit-bench-100k-data). When IMAGE exists
# with the right label the script does nothing. Needs root, btrfs-progs and
# python3.
set -euo pipefail

data=0
force=0
imgs=()
for a in "$@"; do
    case "$a" in
        --data) data=1 ;;
        --force) force=1 ;;
        -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "make-bench-image: unknown option $a" >&2; exit 2 ;;
        *) imgs+=("$a") ;;
    esac
done
[ "${#imgs[@]}" -gt 0 ] || { echo "usage: make-bench-image.sh [--data] [--force] IMAGE [IMAGE...]" >&2; exit 2; }
img=${imgs[0]}
[ "$(id -u)" = 0 ] || { echo "make-bench-image: needs root (loop mount)" >&2; exit 1; }
for t in mkfs.btrfs btrfs losetup python3; do
    command -v "$t" >/dev/null || { echo "make-bench-image: $t not found" >&2; exit 1; }
done

label=btrkit-bench-100k
[ "$data" = 1 ] && label=btrkit-bench-100k-data

if [ -e "$img" ] && [ "$force" = 0 ]; then
    have=$(btrfs inspect-internal dump-super "$img" 2>/dev/null | awk '$1 == "label" { print $2 }')
    if [ "$have" = "$label" ]; then
        echo "make-bench-image: $img is already a $label image (use --force to rebuild)"
        exit 0
    fi
    echo "make-bench-image: $img exists and is not a $label image (label '${have}'); use --force" >&2
    exit 1
fi

start=$(date +%s.%N)
parts=()
for i in "${imgs[@]}"; do
    rm -f "$i.partial"
    truncate -s 4G "$i.partial"
    parts+=("$i.partial")
done
part=${parts[0]}
# shellcheck disable=SC2086 # MKFS_OPTS is a word list on purpose
mkfs.btrfs -f -q -L "$label" ${MKFS_OPTS:-} "${parts[@]}"

mnt=$(mktemp -d /tmp/btrkit-bench-mnt.XXXXXX)
loops=()
cleanup() {
    if mountpoint -q "$mnt"; then
        umount "$mnt" 2>/dev/null || { sleep 1; umount "$mnt" 2>/dev/null; } || umount -l "$mnt"
    fi
    for l in "${loops[@]}"; do losetup -d "$l" 2>/dev/null || true; done
    rmdir "$mnt" 2>/dev/null || true
}
trap cleanup EXIT
opts=noatime
for p in "${parts[@]}"; do
    dev=
    for i in 1 2 3 4 5; do
        dev=$(losetup -f --show "$p") && break
        dev=
        sleep "$i"
    done
    [ -n "$dev" ] || { echo "make-bench-image: no free loop device" >&2; exit 1; }
    loops+=("$dev")
    [ "${#loops[@]}" = 1 ] || opts="$opts,device=$dev"
done
mount -t btrfs -o "$opts" "${loops[0]}" "$mnt"

python3 - "$mnt" "$data" <<'PY'
import os, random, sys
root, data = sys.argv[1], sys.argv[2] == "1"
rng = random.Random(20261130)
# One random pool sliced at varying offsets: incompressible data without
# paying for 1.2 GB of urandom.
pool = os.urandom(64 << 20) if data else b""
total = 0
n = 0
for d in range(100):
    dp = os.path.join(root, "d%03d" % d)
    os.mkdir(dp)
    for f in range(1000):
        i = d * 1000 + f
        if data:
            size = rng.randrange(4096, 20 * 1024 + 1)
            off = rng.randrange(0, len(pool) - size)
            buf = pool[off:off + size]
        elif i % 100 == 99:
            size = rng.randrange(4096, 64 * 1024 + 1)
            buf = os.urandom(size)
        else:
            buf = b"file %d\n" % i
        fd = os.open(os.path.join(dp, "f%05d" % i), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, buf)
        finally:
            os.close(fd)
        total += len(buf)
        n += 1
print("make-bench-image: %d files, %d directories, %d bytes of data" % (n, 100, total))
PY

umount "$mnt"
for l in "${loops[@]}"; do losetup -d "$l"; done
loops=()
rmdir "$mnt"
trap - EXIT
# The first device last: it is what the "already built" check reads.
for i in "${imgs[@]:1}" "$img"; do mv -f "$i.partial" "$i"; done
end=$(date +%s.%N)
awk -v a="$start" -v b="$end" -v i="$img" -v l="$label" \
    'BEGIN { printf "make-bench-image: %s ready (%s) in %.1f s\n", i, l, b - a }'
