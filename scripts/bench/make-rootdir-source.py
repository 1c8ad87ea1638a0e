#!/usr/bin/env python3
"""Create the --rootdir benchmark source: 100,000 files, about 1.2 GB, in
100 directories (sizes from a few bytes to ~60 KiB, deterministic content).

usage: make-rootdir-source.py DIR [NFILES] [TOTAL_MB]
"""
import os
import random
import sys

def main():
    root = sys.argv[1]
    nfiles = int(sys.argv[2]) if len(sys.argv) > 2 else 100_000
    total_mb = int(sys.argv[3]) if len(sys.argv) > 3 else 1200
    marker = os.path.join(root, ".complete")
    if os.path.exists(marker):
        return
    os.makedirs(root, exist_ok=True)
    rng = random.Random(42)
    avg = total_mb * 1_000_000 // nfiles
    pool = rng.randbytes(1 << 20) * 2
    for i in range(nfiles):
        d = os.path.join(root, "dir%03d" % (i % 100))
        if i < 100:
            os.makedirs(d, exist_ok=True)
        # Mix of tiny (inline) and larger files around the average size.
        size = rng.randint(1, 2000) if i % 4 == 0 else rng.randint(avg // 2, avg * 3 // 2 + avg // 3)
        off = rng.randrange(0, 1 << 20)
        with open(os.path.join(d, "file%06d" % i), "wb") as f:
            f.write(pool[off:off + size])
    open(marker, "w").close()

if __name__ == "__main__":
    main()
