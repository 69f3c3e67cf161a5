#!/usr/bin/env python3
"""bench/fsync.py [DIR] [N]: what one fdatasync costs on the file system under DIR (default
/var/tmp), the cost every Raft log append pays twice in series (leader, then follower): after
appending 600 bytes to a growing file (as RocksDB's WAL does), after overwriting blocks written
before (a log reusing its files), and after writing into blocks fallocate(2) reserved (unwritten
extents). Prints the median and 90th percentile of N (default 300) each, in milliseconds."""
import os
import sys
import time

where = sys.argv[1] if len(sys.argv) > 1 else "/var/tmp"
n = int(sys.argv[2]) if len(sys.argv) > 2 else 300
path = os.path.join(where, f"cairn-fsync-probe-{os.getpid()}")


def run(name, prepare):
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        prepare(fd)
        took = []
        for _ in range(n):
            os.write(fd, b"x" * 600)
            start = time.perf_counter()
            os.fdatasync(fd)
            took.append(time.perf_counter() - start)
    finally:
        os.close(fd)
        os.unlink(path)
    took.sort()
    print(f"{name:<22} p50 {took[n // 2] * 1e3:.3f} ms  p90 {took[n * 9 // 10] * 1e3:.3f} ms")


def written_before(fd):
    os.write(fd, b"\0" * (n * 600 + 4096))
    os.fsync(fd)
    os.lseek(fd, 0, os.SEEK_SET)


def reserved(fd):
    os.posix_fallocate(fd, 0, n * 600 + 4096)
    os.fsync(fd)


run("append", lambda fd: None)
run("overwrite", written_before)
run("fallocated", reserved)
