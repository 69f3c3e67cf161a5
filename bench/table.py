#!/usr/bin/env python3
"""bench/table.py RESULTS: one Markdown table from the lines bench/fio.sh and bench/mdbench.py
appended to RESULTS ("LABEL JOB VALUE ..."), with Cairn's ratio to local ext4 and to the best
peer (the best of every other column but ext4) in the same run. Data-path rows are MiB/s
(random reads also IOPS), metadata rows ops/s; higher is better everywhere."""
import sys
from collections import OrderedDict

ROWS = [
    ("seqwrite", "sequential write 1 MiB", "MiB/s"),
    ("seqread", "sequential read 1 MiB, cold", "MiB/s"),
    ("seqread-warm", "sequential read 1 MiB, warm", "MiB/s"),
    ("randread4k", "random read 4 KiB, 4 jobs", "IOPS"),
    ("randread128k", "random read 128 KiB, 4 jobs", "MiB/s"),
    ("smallwrite", "128 KiB files, write", "files/s"),
    ("smallread", "128 KiB files, read cold", "files/s"),
    ("create", "create", "ops/s"),
    ("stat", "stat", "ops/s"),
    ("readdir", "readdir", "entries/s"),
    ("write4k", "4 KiB files, write", "files/s"),
    ("read4k", "4 KiB files, read", "files/s"),
    ("unlink", "unlink", "ops/s"),
    ("mkdir", "mkdir", "ops/s"),
]

values = {}
labels = OrderedDict()
for line in open(sys.argv[1]):
    parts = line.split()
    if len(parts) < 3 or parts[2] == "FAILED":
        continue
    label, job = parts[0], parts[1]
    labels[label] = True
    mib = float(parts[2])
    if job in ("randread4k",):
        value = float(parts[3])
    elif job in ("smallwrite", "smallread"):
        value = mib * 8  # 128 KiB files: 8 per MiB
    else:
        value = mib
    values[(label, job)] = value

# Cairn's columns (`cairn`, and `cairn-fsync` when both durabilities ran) come first, each
# with its ratios; every other column but ext4 is a peer.
mine = [l for l in labels if l == "cairn" or l.startswith("cairn-")]
cols = [l for l in labels if l not in mine]
peers = [l for l in cols if l != "ext4"]
ratios = [f"{m} / {base}" for m in mine for base in ("ext4", "best peer")]
header = ["", "unit"] + mine + cols + ratios
print("| " + " | ".join(header) + " |")
print("|" + "---|" * len(header))
for job, name, unit in ROWS:
    if not any((l, job) in values for l in labels):
        continue
    row = [name, unit]
    for l in mine + cols:
        v = values.get((l, job))
        row.append("-" if v is None else f"{v:,.0f}")
    e = values.get(("ext4", job))
    best = max((values[(p, job)] for p in peers if (p, job) in values), default=None)
    for m in mine:
        c = values.get((m, job))
        row.append("-" if c is None or not e else f"{c / e:.2f}")
        row.append("-" if c is None or not best else f"{c / best:.2f}")
    print("| " + " | ".join(row) + " |")
