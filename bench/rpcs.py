#!/usr/bin/env python3
"""bench/rpcs.py MNT META_METRICS MOUNT_METRICS N: run by bench/rpcs.sh (see there). readdir
counts entries listed (the directory of N files, listed five times). stat-expired stats every
file again once the kernel's cached entries have expired, so each is a metaserver lookup."""
import collections
import os
import sys
import time
import urllib.request

mnt, meta, mount, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])


def counts():
    found = collections.Counter()
    for addr, prefix, short in ((meta, "cairn_rpc_requests_total", "meta"), (mount, "cairn_client_fuse_ops_total", "fuse")):
        for line in urllib.request.urlopen(f"http://{addr}/metrics").read().decode().splitlines():
            if not line.startswith(prefix):
                continue
            key, value = line.rsplit(" ", 1)
            if short == "meta":
                if 'service="meta"' not in key or "Heartbeat" in key:
                    continue
                method = key.split('method="')[1].split('"')[0]
                code = key.split('code="')[1].split('"')[0]
                key = f"meta {method}" + ("" if code == "Ok" else f" ({code})")
            else:
                key = "fuse " + key.split('op="')[1].split('"')[0]
            found[key] += float(value)
    return found


root = os.path.join(mnt, "rpcs")
os.makedirs(root)
# RPCS_AS_UID=N: the file operations run as that user (no groups; root only to drop caches),
# so the metaserver's per-user checks read the inodes they check.
as_uid = int(os.environ.get("RPCS_AS_UID", "0"))
if as_uid:
    "localhost".encode("idna")  # loaded now: the metrics scrapes need it later
    os.chown(root, as_uid, as_uid)
    os.setgroups([])
    os.setresgid(as_uid, as_uid, 0)
    os.setresuid(as_uid, as_uid, 0)
names = [os.path.join(root, f"f{i:07d}") for i in range(n)]
blob = os.urandom(4096)


def create():
    for p in names:
        os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o644))


def stat():
    for p in names:
        os.stat(p)


def readdir():
    for _ in range(5):
        assert sum(1 for _ in os.scandir(root)) == n


def write4k():
    for p in names:
        with open(p + "w", "wb") as f:
            f.write(blob)


def read4k():
    for p in names:
        with open(p + "w", "rb") as f:
            f.read()


def unlink():
    for p in names:
        os.unlink(p)


phases = (("create", create), ("stat", stat), ("stat-expired", stat), ("readdir", readdir), ("write4k", write4k),
          ("read4k", read4k), ("unlink", unlink))
for name, fn in phases:
    if name == "stat-expired":
        # The kernel's entries and attributes (1 s) have expired: every stat asks the metaserver,
        # whatever the creates before took.
        time.sleep(1.5)
    if name == "read4k":
        os.sync()
        if as_uid:
            os.seteuid(0)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
        if as_uid:
            os.seteuid(as_uid)
    before = counts()
    start = time.perf_counter()
    fn()
    secs = time.perf_counter() - start
    after = counts()
    ops = 5 * n if name == "readdir" else n  # readdir: entries listed, five listings
    per_op = {k: (after[k] - before[k]) / ops for k in sorted(after) if after[k] - before[k] > 0}
    meta_total = sum(v for k, v in per_op.items() if k.startswith("meta"))
    print(f"{name}: {ops / secs:.0f} ops/s, {meta_total:.3f} metaserver requests per op")
    print("   " + ", ".join(f"{k} {v:.2f}" for k, v in per_op.items()))
