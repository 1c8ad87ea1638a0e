#!/usr/bin/env python3
# The I/O floor of `tune -u` on one image: what any correct tool must do
# to it, and nothing else, timed cold.
#
# usage: tune-u-floor.py IMAGE [--btrfs PATH]
#
# Every tree block the extent tree records (from `btrfs inspect-internal
# dump-tree -t extent`), mapped to its copies through the chunk tree (DUP
# or single, one device) is read once, cold, in runs of neighbouring
# blocks (4 MiB requests, 8 in flight: the fastest cold read here); then
# every block's first copy gets its header sector written (the sector
# holding the fsid and checksum) and the file is flushed, then every
# second copy and a flush: the least writing and the one flush per copy
# that a crash-safe change of every header needs. Bytes written are the
# bytes already there, so the image is unchanged. Prints the phases and
# the total in seconds. The same with whole blocks written as runs is
# printed for comparison (the page cache writes back whole pages, so the
# cheaper of the two is the floor).
import os, re, subprocess, sys, threading, time

img = sys.argv[1]
btrfs = sys.argv[sys.argv.index("--btrfs") + 1] if "--btrfs" in sys.argv else "btrfs"


def dump(tree):
    return subprocess.run([btrfs, "inspect-internal", "dump-tree", "-t", tree, img],
                          check=True, capture_output=True, text=True).stdout


chunks = []  # (logical, length, [physical...])
cur = None
for line in dump("chunk").splitlines():
    m = re.search(r"CHUNK_ITEM (\d+)\)", line)
    if m:
        cur = [int(m.group(1)), 0, []]
        chunks.append(cur)
    m = re.search(r"^\s+length (\d+) ", line)
    if m and cur:
        cur[1] = int(m.group(1))
    m = re.search(r"stripe \d+ devid 1 offset (\d+)", line)
    if m and cur:
        cur[2].append(int(m.group(1)))
nodesize = int(re.search(r"nodesize\s+(\d+)", subprocess.run(
    [btrfs, "inspect-internal", "dump-super", img], check=True, capture_output=True,
    text=True).stdout).group(1))
blocks = sorted({int(m.group(1)) for m in re.finditer(
    r"key \((\d+) (?:METADATA_ITEM|EXTENT_ITEM) \d+\).*\n.*flags TREE_BLOCK", dump("extent"))}
    | {int(m.group(1)) for m in re.finditer(r"key \((\d+) METADATA_ITEM", dump("extent"))})


def copies(b):
    for lo, ln, st in chunks:
        if lo <= b < lo + ln:
            return [p + (b - lo) for p in st]
    sys.exit(f"block {b} in no chunk")


phys = [copies(b) for b in blocks]
ncopies = max(len(p) for p in phys)


def runs(offsets, size):
    out = []
    for o in sorted(offsets):
        if out and out[-1][0] + out[-1][1] == o and out[-1][1] < (4 << 20):
            out[-1][1] += size
        else:
            out.append([o, size])
    return out


def drop():
    fd = os.open(img, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


def measure(whole):
    drop()
    fd = os.open(img, os.O_RDWR)
    t0 = time.time()
    todo = runs([p[0] for p in phys], nodesize)
    lock = threading.Lock()
    data = {}

    def reader():
        while True:
            with lock:
                if not todo:
                    return
                o, n = todo.pop()
            b = os.pread(fd, n, o)
            with lock:
                data[o] = b
    ts = [threading.Thread(target=reader) for _ in range(8)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    t1 = time.time()
    # Every copy is written from the first copy's bytes (DUP copies are
    # equal): nothing but the first copies is ever read.
    block = {}
    for o, b in data.items():
        for k in range(0, len(b), nodesize):
            block[o + k] = b[k:k + nodesize]
    marks = [t1]
    for c in range(ncopies):
        pairs = [(p[c], block[p[0]]) for p in phys if len(p) > c]
        if whole:
            at = dict(pairs)
            for o, n in runs(list(at), nodesize):
                os.pwrite(fd, b"".join(at[o + k] for k in range(0, n, nodesize)), o)
        else:
            for o, b in pairs:
                os.pwrite(fd, b[:4096], o)
        os.fdatasync(fd)
        marks.append(time.time())
    os.close(fd)
    what = "whole blocks" if whole else "header sectors"
    steps = " ".join(f"copy{c} {marks[c + 1] - marks[c]:.3f}" for c in range(ncopies))
    print(f"{what}: {len(blocks)} blocks x {ncopies} copies: read {t1 - t0:.3f} {steps} "
          f"total {marks[-1] - t0:.3f} s")
    return marks[-1] - t0


a = measure(False)
b = measure(True)
print(f"floor {min(a, b):.3f} s")
