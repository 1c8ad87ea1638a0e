#!/usr/bin/env bash
# btrkit-mount --rw against the kernel's btrfs on a loop mount, on fresh
# images made by mkfs.btrfs, one run of each in turn:
#   extract   tar -xf of 50,000 small files (make-mixed-tree.py is not
#             used: a flat spread of 0-8 KiB files, as a source tree)
#             and a sync, mount and unmount inside the timing
#   rm        rm -rf of them, sync, unmount inside the timing
#   2015      sysbench fileio rndwr, 1,024 files (1 GiB), 4 threads, an
#             fsync pass every 100 writes, TIME seconds: writes/s
#   2016      dbench, 32 clients, the standard loadfile, TIME s: MB/s
#   2009      sysbench fileio rndwr, 1 file of 256 MiB, 4 KiB blocks,
#             fsync every 5 writes, 4 threads, 10,000 requests: writes/s
# (the three seed workloads of scripts/bench/seeds.sh; TIME=20 unless set)
# Prints one line per run: kernel and btrkit figures.
#
# usage: scripts/bench/mount-rw.sh DIR [RUNS]
# Needs root, btrfs-progs, fuse3, dbench, sysbench and a release build.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:?usage: mount-rw.sh DIR [RUNS]}
runs=${2:-3}
TIME=${TIME:-20}
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
fresh() { rm -f "$img"; truncate -s 8G "$img"; mkfs.btrfs -q -f "$img" >/dev/null 2>&1; }
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
# The three seed workloads (scripts/bench/seeds.sh), on a fresh image each.
seed2015() {
    fresh; up "$1"; cd "$mnt"
    sysbench fileio --file-num=1024 --file-total-size=1G prepare >/dev/null
    sysbench fileio --file-num=1024 --file-total-size=1G --file-test-mode=rndwr \
        --file-fsync-freq=100 --threads=4 --time="$TIME" --file-io-mode=sync run \
        | awk '/writes\/s:/ {print $2}'
    cd - >/dev/null; down "$1"
}
seed2016() {
    fresh; up "$1"; mkdir -p "$mnt/db"
    dbench -c /usr/share/dbench/client.txt -t "$TIME" -D "$mnt/db" 32 2>/dev/null \
        | awk '/^Throughput/ {print $2}'
    down "$1"
}
seed2009() {
    fresh; up "$1"; cd "$mnt"
    sysbench fileio --file-num=1 --file-block-size=4096 --file-total-size=256M prepare >/dev/null
    sync -f .
    sysbench fileio --file-num=1 --file-block-size=4096 --file-total-size=256M \
        --file-test-mode=rndwr --file-fsync-freq=5 --threads=4 --events=10000 --time=0 \
        --file-io-mode=sync run | awk '/writes\/s:/ {print $2}'
    cd - >/dev/null; down "$1"
}
echo "run extract-kernel(s) extract-btrkit(s) rm-kernel(s) rm-btrkit(s) 2015-kernel(w/s) 2015-btrkit(w/s) 2016-kernel(MB/s) 2016-btrkit(MB/s) 2009-kernel(w/s) 2009-btrkit(w/s)"
for r in $(seq "$runs"); do
    fresh; cold; ext_k=$(secs extract kernel); cold; rm_k=$(secs remove kernel)
    fresh; cold; ext_o=$(secs extract ours); cold; rm_o=$(secs remove ours)
    a_k=$(seed2015 kernel); a_o=$(seed2015 ours)
    b_k=$(seed2016 kernel); b_o=$(seed2016 ours)
    c_k=$(seed2009 kernel); c_o=$(seed2009 ours)
    echo "$r $ext_k $ext_o $rm_k $rm_o $a_k $a_o $b_k $b_o $c_k $c_o"
done
rm -f "$img"
