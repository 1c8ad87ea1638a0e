#!/usr/bin/env bash
# btrkit-mount --rw against the kernel's btrfs on a loop mount, on fresh
# images made by mkfs.btrfs, one run of each in turn:
#   extract   tar -xf of 50,000 small files (make-mixed-tree.py is not
#             used: a flat spread of 0-8 KiB files, as a source tree)
#             and a sync, mount and unmount inside the timing
#   rm        rm -rf of them, sync, unmount inside the timing
#   dbench    dbench -t 20 2 (the seed workload): MB/s
#   fileio    sysbench fileio rndwr, 64 files of 4 MiB, fsync every 10
#             writes (--file-fsync-freq=10): writes/s
# Prints one line per run: kernel and btrkit figures.
#
# usage: scripts/bench/mount-rw.sh DIR [RUNS]
# Needs root, btrfs-progs, fuse3, dbench, sysbench and a release build.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:?usage: mount-rw.sh DIR [RUNS]}
runs=${2:-3}
mkdir -p "$dir"
cargo build --release -q -p btrkit-mount
bin=$PWD/target/release/btrkit-mount
mnt=$dir/mnt
mkdir -p "$mnt"
tarball=$dir/files.tar
if [ ! -f "$tarball" ]; then
    rm -rf "$dir/src"; mkdir -p "$dir/src"
    python3 - "$dir/src" <<'PY'
import os, random, sys
r = random.Random(50000)
root = sys.argv[1]
for i in range(50000):
    d = os.path.join(root, "d%03d" % (i % 500), "s%d" % (i % 7))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "f%d" % i), "wb") as f:
        f.write(bytes(r.getrandbits(8) for _ in range(r.randrange(0, 8192))))
PY
    tar -cf "$tarball" -C "$dir/src" .
    rm -rf "$dir/src"
fi
img=$dir/rw.img
fresh() { rm -f "$img"; truncate -s 8G "$img"; mkfs.btrfs -q -f "$img"; }
up() {
    case $1 in
        kernel) mount -o loop "$img" "$mnt" ;;
        ours) "$bin" --rw "$img" "$mnt" ;;
    esac
}
down() {
    case $1 in
        kernel) umount "$mnt" ;;
        ours)
            fusermount3 -u "$mnt"
            # The server commits and exits; the image is locked until then.
            flock "$img" true ;;
    esac
}
secs() { local s e; s=$(date +%s.%N); "$@"; e=$(date +%s.%N); echo "$e - $s" | bc; }
cold() { sync; echo 3 > /proc/sys/vm/drop_caches; }
extract() { up "$1"; tar -xf "$tarball" -C "$mnt"; sync -f "$mnt"; down "$1"; }
remove() { up "$1"; rm -rf "${mnt:?}"/*; sync -f "$mnt"; down "$1"; }
dbench_mbs() {
    fresh; up "$1"; mkdir -p "$mnt/db"
    dbench -t 20 -D "$mnt/db" 2 2>/dev/null | awk '/^Throughput/ {print $2}'
    down "$1"
}
fileio() {
    fresh; up "$1"; cd "$mnt"
    sysbench fileio --file-num=64 --file-total-size=256M prepare >/dev/null
    sysbench fileio --file-num=64 --file-total-size=256M --file-test-mode=rndwr \
        --file-fsync-freq=10 --time=20 run | awk '/writes\/s:/ {print $2}'
    cd - >/dev/null; down "$1"
}
echo "run extract-kernel(s) extract-btrkit(s) rm-kernel(s) rm-btrkit(s) dbench-kernel(MB/s) dbench-btrkit(MB/s) fileio-kernel(w/s) fileio-btrkit(w/s)"
for r in $(seq "$runs"); do
    fresh; cold; ek=$(secs extract kernel); cold; rk=$(secs remove kernel)
    fresh; cold; eo=$(secs extract ours); cold; ro=$(secs remove ours)
    dk=$(dbench_mbs kernel); do=$(dbench_mbs ours)
    fk=$(fileio kernel); fo=$(fileio ours)
    echo "$r $ek $eo $rk $ro $dk $do $fk $fo"
done
rm -f "$img"
