#!/usr/bin/env python3
"""bench/creates.py DIR[,DIR...] PROCS N: PROCS processes each create N empty files in a
directory of their own under DIR (with SHARED=1 in the environment, all in one directory); prints
the total creates/s. Shows whether a create rate is bound by one process's round trips (latency)
or by the filesystem's capacity. Several DIRs are mounts of one file system: process p works
through the (p mod count)-th, in the same directories (the kernel serializes creates in one
directory of one mount, so several clients creating in one directory need several mounts)."""
import multiprocessing as mp
import os
import sys
import time

roots, procs, n = sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3])
name = f"cairn-bench-creates.{os.getpid()}"


shared = os.environ.get("SHARED") == "1"
if shared:
    os.makedirs(os.path.join(roots[0], name, "all"))


def work(p):
    d = os.path.join(roots[p % len(roots)], name, "all" if shared else str(p))
    if not shared:
        os.makedirs(d)
    for i in range(n):
        os.close(os.open(os.path.join(d, f"f{p}.{i}"), os.O_CREAT | os.O_WRONLY, 0o644))


start = time.perf_counter()
workers = [mp.Process(target=work, args=(p,)) for p in range(procs)]
for w in workers:
    w.start()
for w in workers:
    w.join()
    if w.exitcode != 0:
        sys.exit(f"a creating process failed ({w.exitcode})")
where = (" in one directory" if shared else "") + (f" over {len(roots)} mounts" if len(roots) > 1 else "")
print(f"{procs} processes{where}: {procs * n / (time.perf_counter() - start):.0f} creates/s")
