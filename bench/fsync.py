#!/usr/bin/env python3
"""bench/fsync.py [DIR] [N]: what one fdatasync costs on the file system under DIR (default
/var/tmp), the cost every Raft log append pays twice in series (leader, then follower): after
appending 600 bytes to a growing file (as RocksDB's WAL does), after overwriting blocks written
before (a log reusing its files), and after writing into blocks fallocate(2) reserved (unwritten
extents). Prints the median and 90th percentile of N (default 300) each, in milliseconds.
LOAD=1: while another process writes 256 KiB files under DIR and fdatasyncs each (as chunkservers
storing shards beside the metaservers do), so the file system is busy with other files'
metadata (a journalled file system's journal; this VM's ext4 has none, see bench/RESULTS.md)."""
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


def load(stop_path):
    """Write and sync 256 KiB files (200 names, reused) until `stop_path` appears."""
    block = b"y" * (256 * 1024)
    i = 0
    while not os.path.exists(stop_path):
        name = os.path.join(where, f"cairn-fsync-load-{os.getpid()}-{i % 200}")
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, block)
        os.fdatasync(fd)
        os.close(fd)
        i += 1
    for j in range(200):
        try:
            os.unlink(os.path.join(where, f"cairn-fsync-load-{os.getpid()}-{j}"))
        except FileNotFoundError:
            pass


loader = None
stop = os.path.join(where, f"cairn-fsync-stop-{os.getpid()}")
if os.environ.get("LOAD") == "1":
    loader = os.fork()
    if loader == 0:
        load(stop)
        os._exit(0)
    time.sleep(1)
try:
    run("append", lambda fd: None)
    run("overwrite", written_before)
    run("fallocated", reserved)
finally:
    if loader:
        open(stop, "w").close()
        os.waitpid(loader, 0)
        os.unlink(stop)
