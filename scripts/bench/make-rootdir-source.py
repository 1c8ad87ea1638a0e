#!/usr/bin/env python3
"""Create the --rootdir benchmark source: 100,000 files, about 1.2 GB, in
100 directories (sizes from a few bytes to ~60 KiB, deterministic content).

usage: make-rootdir-source.py DIR [NFILES] [TOTAL_MB] [text]

With `text`, the content is words (compressible about 3:1, as source code
and logs are) instead of random bytes.
"""
import os
import random
import sys

def main():
    root = sys.argv[1]
    nfiles = int(sys.argv[2]) if len(sys.argv) > 2 else 100_000
    total_mb = int(sys.argv[3]) if len(sys.argv) > 3 else 1200
    text = len(sys.argv) > 4 and sys.argv[4] == "text"
    marker = os.path.join(root, ".complete")
    if os.path.exists(marker):
        return
    os.makedirs(root, exist_ok=True)
    rng = random.Random(42)
    avg = total_mb * 1_000_000 // nfiles
    if text:
        words = [bytes(rng.choice(b"abcdefghijklmnopqrstuvwxyz_") for _ in range(rng.randint(2, 10)))
                 for _ in range(5000)]
        out = bytearray()
        while len(out) < 1 << 20:
            line = b" ".join(rng.choice(words) for _ in range(rng.randint(3, 14)))
            out += b"    " * rng.randint(0, 3) + line + b";\n"
        pool = bytes(out[:1 << 20]) * 2
    else:
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
