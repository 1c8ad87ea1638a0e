#!/usr/bin/env bash
# Reading every file through btrkit-mount against the kernel's read-only
# loop mount of the same image.
#
# usage: scripts/bench/mount.sh DIR [RUNS] [--data|--large]
#
# Builds DIR/restore.img once (tests/scripts/make-bench-image.sh: 100,000
# files; with --data, DIR/restore-data.img with 1.2 GB of file data; with
# --large, DIR/large.img: mkfs.btrfs defaults, 8 files of 128 MiB of
# random bytes written through the kernel), then
# times, cold (every cache dropped before each run), one run of each in turn:
#   mount -o ro,loop IMG MNT;  read every file;  umount
#   btrkit-mount IMG MNT;      read every file;  fusermount3 -u
# "read every file" is `find MNT -type f -print0 | xargs -0 cat >/dev/null`
# (one cat per few thousand files, the same for both). The mount and the
# unmount are inside the timing. Prints wall seconds per run.
# Needs root, btrfs-progs, fuse3 and a release build.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:?usage: mount.sh DIR [RUNS] [--data]}
runs=${2:-5}
data=${3:-}
mkdir -p "$dir"
img=$dir/restore.img
case "$data" in
  --data) img=$dir/restore-data.img; tests/scripts/make-bench-image.sh --data "$img" ;;
  --large)
    img=$dir/large.img
    if [ ! -f "$img" ]; then
      truncate -s 4G "$img.tmp"; mkfs.btrfs -q -f "$img.tmp"
      mkdir -p "$dir/fill"; mount -o loop "$img.tmp" "$dir/fill"
      for i in 1 2 3 4 5 6 7 8; do head -c 128M /dev/urandom > "$dir/fill/f$i"; done
      umount "$dir/fill"; rmdir "$dir/fill"; mv "$img.tmp" "$img"
    fi ;;
  *) tests/scripts/make-bench-image.sh "$img" ;;
esac
cargo build --release -q -p btrkit-mount
bin=$PWD/target/release/btrkit-mount
mnt=$dir/mnt
mkdir -p "$mnt"
cold() { sync; echo 3 > /proc/sys/vm/drop_caches; }
readall() { find "$mnt" -type f -print0 | xargs -0 cat >/dev/null; }
kernel() {
    mount -o ro,loop "$img" "$mnt"
    readall
    umount "$mnt"
}
ours() {
    "$bin" "$img" "$mnt"
    readall
    fusermount3 -u "$mnt"
    # The server is gone once the mount point is no longer listed.
    while grep -q " $mnt " /proc/self/mountinfo; do sleep 0.01; done
}
secs() { local s e; s=$(date +%s.%N); "$@"; e=$(date +%s.%N); echo "$e - $s" | bc; }
echo "run kernel(s) btrkit-mount(s)"
for r in $(seq "$runs"); do
    cold; a=$(secs kernel)
    cold; b=$(secs ours)
    echo "$r $a $b"
done
