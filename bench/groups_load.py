#!/usr/bin/env python3
"""bench/groups_load.py N DIR...: one process per DIR (directories of a mount, each in the group
its caller chose: bench/groups_scale.sh picks as many in each metadata group), each creating N
empty files in its directory, then stating them, opening and closing them (read-only), and
unlinking them, all processes at once; before the stat and open phases it waits 1.5 s, so the
kernel's cached entries and attributes have expired and every request reaches a metaserver.
Prints each phase's total rate as "op rate/s"."""
import multiprocessing as mp
import os
import sys
import time

n, dirs = int(sys.argv[1]), sys.argv[2:]


def names(d):
    return [os.path.join(d, f"f{i}") for i in range(n)]


def create(d):
    for path in names(d):
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))


def stat(d):
    for path in names(d):
        os.stat(path)


def open_(d):
    for path in names(d):
        os.close(os.open(path, os.O_RDONLY))


def unlink(d):
    for path in names(d):
        os.unlink(path)


def phase(op, fn):
    start = time.perf_counter()
    workers = [mp.Process(target=fn, args=(d,)) for d in dirs]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
        if w.exitcode != 0:
            sys.exit(f"{op}: a process failed ({w.exitcode})")
    print(f"{op} {len(dirs) * n / (time.perf_counter() - start):.0f}/s", flush=True)


phase("create", create)
time.sleep(1.5)
phase("stat", stat)
time.sleep(1.5)
phase("open", open_)
phase("unlink", unlink)
