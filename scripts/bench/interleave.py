#!/usr/bin/env python3
"""Cold runs of several commands interleaved, run by run.

usage: scripts/bench/interleave.py RUNS IMAGE CMD...

Each CMD is a program run as `CMD IMAGE`, or a command line with `{}`
where the image goes (`"btrfs check --readonly {}"`). Every round runs
each command once (alternately forward and backward), so that a noisy
machine's drift falls on all of them alike; hyperfine runs one command's
runs after the other's. Before each run the image's pages are dropped
(posix_fadvise DONTNEED); with ALL_COLD=1 every cache is dropped instead
(echo 3 > /proc/sys/vm/drop_caches: binaries and libraries start cold
too; needs root). Prints, per command, the median, mean, minimum and
first quartile of the wall time and the median CPU time (user + system).
"""
import os
import statistics
import subprocess
import sys
import time


def cold(img):
    if os.environ.get("ALL_COLD"):
        subprocess.run("sync; echo 3 > /proc/sys/vm/drop_caches", shell=True, check=True)
    else:
        f = os.open(img, os.O_RDONLY)
        os.posix_fadvise(f, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(f)


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    runs, img, cmds = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    wall = {c: [] for c in cmds}
    cpu = {c: [] for c in cmds}
    for i in range(runs):
        for c in cmds if i % 2 == 0 else cmds[::-1]:
            argv = c.replace("{}", img).split() if "{}" in c else [c, img]
            cold(img)
            r0 = os.times()
            t = time.perf_counter()
            subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wall[c].append((time.perf_counter() - t) * 1000)
            r1 = os.times()
            cpu[c].append((r1.children_user - r0.children_user
                           + r1.children_system - r0.children_system) * 1000)
    for c in cmds:
        v = sorted(wall[c])
        print(f"{c}: median {statistics.median(v):.1f} ms, mean {statistics.mean(v):.1f}, "
              f"min {v[0]:.1f}, q1 {v[len(v) // 4]:.1f}; cpu median {statistics.median(cpu[c]):.0f} ms")


if __name__ == "__main__":
    main()
