#!/usr/bin/env python3
"""bench/creates.py DIR PROCS N: PROCS processes each create N empty files in a directory of
their own under DIR; prints the total creates/s. Shows whether a create rate is bound by one
process's round trips (latency) or by the filesystem's capacity."""
import multiprocessing as mp
import os
import sys
import time

root, procs, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
base = os.path.join(root, f"cairn-bench-creates.{os.getpid()}")


def work(p):
    d = os.path.join(base, str(p))
    os.makedirs(d)
    for i in range(n):
        os.close(os.open(os.path.join(d, f"f{i}"), os.O_CREAT | os.O_WRONLY, 0o644))


start = time.perf_counter()
workers = [mp.Process(target=work, args=(p,)) for p in range(procs)]
for w in workers:
    w.start()
for w in workers:
    w.join()
    if w.exitcode != 0:
        sys.exit(f"a creating process failed ({w.exitcode})")
print(f"{procs} processes: {procs * n / (time.perf_counter() - start):.0f} creates/s")
