#!/usr/bin/env python3
"""bench/mdbench.py DIR LABEL OUT [N]: metadata rates in one fresh directory, one process, the
way a data loader or an untar touches a filesystem. Appends "LABEL op ops/s" lines to OUT for:
create (empty files), stat, readdir (entries/s), write4k and read4k (whole 4 KiB files, read
back cold when run as root), unlink, mkdir, rmdir."""
import os
import sys
import time

directory, label, out = sys.argv[1], sys.argv[2], sys.argv[3]
n = int(sys.argv[4]) if len(sys.argv) > 4 else 10000
root = os.path.join(directory, f"cairn-bench-md.{os.getpid()}")
os.makedirs(root)
results = []


def rate(op, count, fn):
    start = time.perf_counter()
    fn()
    secs = time.perf_counter() - start
    line = f"{label} {op} {count / secs:.0f}"
    print(line, flush=True)
    results.append(line)


def drop_caches():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
    except OSError:
        pass


names = [os.path.join(root, f"f{i:07d}") for i in range(n)]


def create():
    for p in names:
        os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o644))


rate("create", n, create)
rate("stat", n, lambda: [os.stat(p) for p in names])
rate("readdir", n, lambda: sum(1 for _ in os.scandir(root)))
rate("unlink", n, lambda: [os.unlink(p) for p in names])

small = [os.path.join(root, f"s{i:06d}") for i in range(max(n // 5, 1))]
blob = os.urandom(4096)


def write_small():
    for p in small:
        with open(p, "wb") as f:
            f.write(blob)


def read_small():
    for p in small:
        with open(p, "rb") as f:
            if len(f.read()) != len(blob):
                raise SystemExit(f"{p}: short read")


rate("write4k", len(small), write_small)
drop_caches()
rate("read4k", len(small), read_small)
for p in small:
    os.unlink(p)

dirs = [os.path.join(root, f"d{i:05d}") for i in range(max(n // 10, 1))]
rate("mkdir", len(dirs), lambda: [os.mkdir(p) for p in dirs])
rate("rmdir", len(dirs), lambda: [os.rmdir(p) for p in dirs])
os.rmdir(root)
with open(out, "a") as f:
    f.write("".join(line + "\n" for line in results))
