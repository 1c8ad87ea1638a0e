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
# The same files as a user would write them: a create and a write line
# each (distinct contents), 200,101 lines, which btrkit-shell streams.
awk 'BEGIN {
  for (d = 0; d < 100; d++) {
    printf "mkdir /d%02d\n", d
    for (f = 0; f < 1000; f++) {
      printf "create /d%02d/f%05d\n", d, f
      printf "write /d%02d/f%05d 0 4096 random:%d\n", d, f, d * 1000 + f
    }
  }
  print "sync"
}' > "$W/files-plain.scn"

rm -f "$W/shell.img" "$W/shell-plain.img" "$W/kernel.img"
target/release/btrkit-mkfs -q -b 8G "$W/shell.img"
target/release/btrkit-mkfs -q -b 8G "$W/shell-plain.img"
truncate -s 8G "$W/kernel.img"
mkfs.btrfs -q -f "$W/kernel.img"
sync
echo 3 > /proc/sys/vm/drop_caches

/usr/bin/time -f "btrkit-shell (writefiles): %e s (user %U, sys %S), peak RSS %M KiB" \
  target/release/btrkit-shell "$W/shell.img" "$W/files.scn" -q

echo 3 > /proc/sys/vm/drop_caches
/usr/bin/time -f "btrkit-shell (plain script, $(wc -l < "$W/files-plain.scn") lines): %e s (user %U, sys %S), peak RSS %M KiB" \
  target/release/btrkit-shell "$W/shell-plain.img" "$W/files-plain.scn" -q

mnt=$(mktemp -d)
echo 3 > /proc/sys/vm/drop_caches
/usr/bin/time -f "kernel (mount, mkfiles, umount): %e s (user %U, sys %S), peak RSS of mkfiles %M KiB" \
  sh -c "mount -o loop '$W/kernel.img' '$mnt' && '$W/mkfiles' '$mnt' 100 1000 4096 && umount '$mnt'"
rmdir "$mnt"

# Both images hold the same tree: btrfs check is clean on ours.
for img in shell.img shell-plain.img; do
  if btrfs check --readonly "$W/$img" >/dev/null 2>&1; then
    echo "btrfs check: $img clean"
  else
    echo "btrfs check: $img NOT clean"
  fi
done
