#!/usr/bin/env python3
"""bench/meta_load.py DIR PROCS N: PROCS processes, each in a directory of its own under DIR,
create N empty files, stat them again once the kernel's cached entries expired (1.5 s later, so
every stat reaches the metaserver), unlink them, then write N 4 KiB files (create, write,
close); prints each phase's total rate as "op rate/s". How a metadata service holds up under
many clients at once, not one client's latency."""
import multiprocessing as mp
import os
import sys
import time

root, procs, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
base = os.path.join(root, f"cairn-bench-load.{os.getpid()}")
block = b"x" * 4096


def names(p, prefix):
    return [os.path.join(base, str(p), f"{prefix}{i}") for i in range(n)]


def create(p):
    for path in names(p, "f"):
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))


def stat(p):
    for path in names(p, "f"):
        os.stat(path)


def unlink(p):
    for path in names(p, "f"):
        os.unlink(path)


def write4k(p):
    for path in names(p, "w"):
        with open(path, "wb") as f:
            f.write(block)


def phase(fn):
    start = time.perf_counter()
    workers = [mp.Process(target=fn, args=(p,)) for p in range(procs)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
        if w.exitcode != 0:
            sys.exit(f"{fn.__name__}: a process failed ({w.exitcode})")
    print(f"{fn.__name__} {procs * n / (time.perf_counter() - start):.0f}/s", flush=True)


for p in range(procs):
    os.makedirs(os.path.join(base, str(p)))
phase(create)
time.sleep(1.5)
phase(stat)
phase(unlink)
phase(write4k)
