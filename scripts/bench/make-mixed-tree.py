#!/usr/bin/env python3
"""Create a --rootdir benchmark source shaped like a real system tree.

usage: make-mixed-tree.py DIR [TOTAL_MB]   (default 600)

Ten top-level directories dir000..dir009 (so `-u dir00N` makes them
subvolumes), each a nested tree (up to 6 levels) of directories and files
whose sizes spread as on a root filesystem: most files small, a long tail
to 8 MiB (per cent of files: 39.7 under 1 KiB, 40 of 1-16 KiB, 17 of
16-256 KiB, 3 of 256 KiB-2 MiB, 0.3 of 2-8 MiB; about 50 KB a file, as
/usr on a desktop). Contents of three kinds,
as /usr holds them: text (words, compresses about 3:1: sources, docs,
configs), binary like executables (runs of zeros and repeated tables
between random stretches, about 2:1) and incompressible (random bytes:
archives, images, already compressed data). Also symlinks (relative, to
files and directories) and hard links, and a few empty files and
directories. Deterministic (seeded), written once: DIR/.complete marks a
finished tree.
"""
import os
import random
import sys

KIB = 1024
MIB = 1024 * KIB
BUCKETS = [  # (share of files, low, high)
    (0.397, 0, 1 * KIB),
    (0.40, 1 * KIB, 16 * KIB),
    (0.17, 16 * KIB, 256 * KIB),
    (0.03, 256 * KIB, 2 * MIB),
    (0.003, 2 * MIB, 8 * MIB),
]


def main():
    root = sys.argv[1]
    total = int(sys.argv[2]) * 1_000_000 if len(sys.argv) > 2 else 600_000_000
    marker = os.path.join(root, ".complete")
    if os.path.exists(marker):
        return
    os.makedirs(root, exist_ok=True)
    rng = random.Random(20261206)

    words = [bytes(rng.choice(b"abcdefghijklmnopqrstuvwxyz_") for _ in range(rng.randint(2, 10)))
             for _ in range(8000)]
    text = bytearray()
    while len(text) < 16 * MIB:
        text += b" ".join(rng.choice(words) for _ in range(rng.randint(3, 14))) + b"\n"
    noise = rng.randbytes(16 * MIB)
    tables = [rng.randbytes(rng.randint(16, 256)) for _ in range(64)]

    def content(kind, n):
        if n == 0:
            return b""
        if kind == "text":
            at = rng.randrange(0, len(text) - n) if n < len(text) else 0
            return bytes(text[at:at + n]) if n <= len(text) else bytes(text) * (n // len(text) + 1)
        if kind == "random":
            out = bytearray()
            while len(out) < n:
                at = rng.randrange(0, len(noise) - 4096)
                out += noise[at:at + min(n - len(out), len(noise) - at)]
            return bytes(out[:n])
        # Executable-like: random code stretches, zero padding, tables.
        out = bytearray()
        while len(out) < n:
            r = rng.random()
            if r < 0.4:
                at = rng.randrange(0, len(noise) - 8192)
                out += noise[at:at + rng.randint(256, 8192)]
            elif r < 0.7:
                out += bytes(rng.randint(64, 4096))
            else:
                out += rng.choice(tables) * rng.randint(4, 64)
        return bytes(out[:n])

    def size():
        r = rng.random()
        for share, lo, hi in BUCKETS:
            if r < share:
                # Log-uniform inside the bucket.
                lo1 = max(lo, 1)
                v = int(lo1 * (hi / lo1) ** rng.random())
                return 0 if lo == 0 and rng.random() < 0.03 else min(max(v, lo), hi)
            r -= share
        return 4 * KIB

    files, dirs = [], []
    written = 0
    top = [os.path.join(root, f"dir{i:03d}") for i in range(10)]
    for t in top:
        os.makedirs(t, exist_ok=True)
        dirs.append(t)
    n = 0
    while written < total:
        # A directory: mostly an existing one, sometimes a new child (at
        # most 6 levels under the top ones).
        if rng.random() < 0.06 or len(dirs) < 40:
            parent = rng.choice(dirs)
            if parent.count(os.sep) - root.count(os.sep) < 7:
                d = os.path.join(parent, f"d{len(dirs):05d}")
                os.makedirs(d, exist_ok=True)
                dirs.append(d)
        d = rng.choice(dirs)
        kind = rng.choices(["text", "exec", "random"], weights=[50, 30, 20])[0]
        s = size()
        p = os.path.join(d, f"f{n:06d}" + {"text": ".txt", "exec": "", "random": ".bin"}[kind])
        with open(p, "wb") as f:
            f.write(content(kind, s))
        files.append(p)
        written += s
        n += 1
        r = rng.random()
        if r < 0.05 and files:
            # A relative symlink to a file or a directory of the same tree.
            target = rng.choice(files) if rng.random() < 0.8 else rng.choice(dirs)
            link = os.path.join(rng.choice(dirs), f"l{n:06d}")
            if not os.path.lexists(link):
                os.symlink(os.path.relpath(target, os.path.dirname(link)), link)
        elif r < 0.07 and files:
            # A hard link inside the same top-level directory (a subvolume
            # boundary cannot be crossed by a hard link).
            src = rng.choice(files)
            topdir = os.path.join(root, os.path.relpath(src, root).split(os.sep)[0])
            cands = [x for x in dirs if x.startswith(topdir + os.sep) or x == topdir]
            link = os.path.join(rng.choice(cands), f"h{n:06d}")
            if not os.path.lexists(link):
                os.link(src, link)
    for i in range(20):
        os.makedirs(os.path.join(rng.choice(dirs), f"empty{i:02d}"), exist_ok=True)
    open(marker, "w").close()
    print(f"make-mixed-tree: {n} files, {len(dirs)} directories, {written / 1e6:.0f} MB in {root}")


if __name__ == "__main__":
    main()
