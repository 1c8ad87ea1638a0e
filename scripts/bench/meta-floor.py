#!/usr/bin/env python3
# The metadata floor of a check: the first copy of every tree block the
# extent tree lists, read once, cold, with direct reads in disk order,
# runs of up to 4 MiB joined across gaps of up to 128 KiB (what
# btrkit-fsck's block stream reads), one request at a time and 8 in
# flight. Nothing is checked: no tool that reads every tree block can
# be faster than this on the same disk.
#
# usage: scripts/bench/meta-floor.py IMAGE [RUNS]
# Single-device images (the first stripe of each metadata chunk); needs
# btrfs-progs (dump-tree lists the blocks before the clock starts).
import os, re, subprocess, sys, threading, time, mmap

img = sys.argv[1]
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
nodesize = int(re.search(r"^nodesize\s+(\d+)", subprocess.run(
    ["btrfs", "inspect-internal", "dump-super", img], capture_output=True, text=True,
    check=True).stdout, re.M).group(1))
chunks = []
cur = None
for line in subprocess.run(["btrfs", "inspect-internal", "dump-tree", "-t", "chunk", img],
                           capture_output=True, text=True, check=True).stdout.splitlines():
    m = re.search(r"key \(FIRST_CHUNK_TREE CHUNK_ITEM (\d+)\)", line)
    if m:
        cur = [int(m.group(1)), 0, None]
        chunks.append(cur)
    m = re.search(r"^\s+length (\d+)", line)
    if m and cur:
        cur[1] = int(m.group(1))
    m = re.search(r"stripe 0 devid \d+ offset (\d+)", line)
    if m and cur and cur[2] is None:
        cur[2] = int(m.group(1))
blocks = []
for line in subprocess.run(["btrfs", "inspect-internal", "dump-tree", "-t", "extent", img],
                           capture_output=True, text=True, check=True).stdout.splitlines():
    m = re.search(r"key \((\d+) METADATA_ITEM", line) or re.search(
        r"key \((\d+) EXTENT_ITEM (\d+)\).*", line)
    if not m or ("EXTENT_ITEM" in line and int(m.group(2)) != nodesize):
        continue
    if "EXTENT_ITEM" in line:
        continue  # data extents (tree blocks of non-skinny images are rare)
    b = int(m.group(1))
    for (log, length, phys) in chunks:
        if log <= b < log + length:
            blocks.append(b - log + phys)
            break
blocks.sort()
reqs = []
i = 0
while i < len(blocks):
    start = blocks[i]
    j = i + 1
    while (j < len(blocks) and blocks[j] >= blocks[j - 1] + nodesize
           and blocks[j] - (blocks[j - 1] + nodesize) <= 128 << 10
           and blocks[j] + nodesize - start <= 4 << 20):
        j += 1
    reqs.append((start, blocks[j - 1] + nodesize - start))
    i = j
total_mib = sum(n for _, n in reqs) / 2**20
print(f"{len(blocks)} tree blocks ({len(blocks) * nodesize / 2**20:.0f} MiB) in {len(reqs)} reads "
      f"of {total_mib:.0f} MiB")


def read_all(depth):
    f = os.open(img, os.O_RDONLY)
    os.posix_fadvise(f, 0, 0, os.POSIX_FADV_DONTNEED)
    fd = os.open(img, os.O_RDONLY | os.O_DIRECT)
    todo = list(reqs)
    lock = threading.Lock()

    def work():
        buf = mmap.mmap(-1, 4 << 20)
        while True:
            with lock:
                if not todo:
                    return
                o, n = todo.pop(0)
            os.preadv(fd, [memoryview(buf)[:n]], o)

    t = time.time()
    ts = [threading.Thread(target=work) for _ in range(depth)]
    [x.start() for x in ts]
    [x.join() for x in ts]
    el = time.time() - t
    os.close(fd)
    os.close(f)
    return el


for depth in (1, 8):
    times = sorted(read_all(depth) * 1000 for _ in range(runs))
    print(f"floor, {depth} in flight: {times[0]:.1f}-{times[-1]:.1f} ms "
          f"(median {times[len(times) // 2]:.1f})")
