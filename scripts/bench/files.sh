#!/usr/bin/env bash
# The files benchmark of the engine: 100,000 files of 4 KiB in 100
# directories, then sync, through btrkit-shell (btrkit's engine on an image
# file) and through the kernel (scripts/bench/mkfiles.c on a loop mount of
# an image on the same disk), each timed from mount to unmount, peak RSS
# of the process that does the work. Needs root, cc, btrfs-progs.
#   scripts/bench/files.sh [WORKDIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
W=${1:-target/bench-files}
mkdir -p "$W"
cargo build -q --release -p btrkit-shell -p btrkit-mkfs
cc -O2 -o "$W/mkfiles" scripts/bench/mkfiles.c
{
  for d in $(seq -w 0 99); do
    echo "mkdir /d$d"
    echo "writefiles /d$d 1000 4096 none"
  done
  echo sync
} > "$W/files.scn"

rm -f "$W/shell.img" "$W/kernel.img"
target/release/btrkit-mkfs -q -b 8G "$W/shell.img"
truncate -s 8G "$W/kernel.img"
mkfs.btrfs -q -f "$W/kernel.img"
sync
echo 3 > /proc/sys/vm/drop_caches

/usr/bin/time -f "btrkit-shell: %e s (user %U, sys %S), peak RSS %M KiB" \
  target/release/btrkit-shell "$W/shell.img" "$W/files.scn" -q

mnt=$(mktemp -d)
echo 3 > /proc/sys/vm/drop_caches
/usr/bin/time -f "kernel (mount, mkfiles, umount): %e s (user %U, sys %S), peak RSS of mkfiles %M KiB" \
  sh -c "mount -o loop '$W/kernel.img' '$mnt' && '$W/mkfiles' '$mnt' 100 1000 4096 && umount '$mnt'"
rmdir "$mnt"

# Both images hold the same tree: btrfs check is clean on ours.
btrfs check --readonly "$W/shell.img" >/dev/null 2>&1 && echo "btrfs check: shell.img clean"
