#!/usr/bin/env python3
"""bench/ml/table.py RESULTS: Markdown tables from the lines bench/ml/run.sh collected:
"LABEL FRAMEWORK FORMAT EPOCH SAMPLES/S MIB/S UTILISATION% SECONDS" from the loaders and
"LABEL stage cp-r MIB/S". Rows are framework x format x epoch, columns the filesystems (ext4 first),
then Cairn's ratio to ext4 and to the best peer (the best of every other column but ext4) in the
same run. Higher is better everywhere."""
import sys
from collections import OrderedDict

FORMATS = {"imagenet": "JPEG files", "wds": "tar shards", "tfrecord": "TFRecord", "npz": "npz volumes"}
EPOCHS = {"epoch1": "epoch 1 (cold)", "epoch2": "epoch 2", "warmup": "after cairn warmup (cold cache)",
          "accel": "epoch 1 (cold), emulated accelerator"}

rows = OrderedDict()  # (fw, fmt, epoch) -> {label: (samples/s, MiB/s, au)}
labels = OrderedDict()
for line in open(sys.argv[1]):
    parts = line.split()
    if len(parts) == 4 and parts[1] == "stage":
        labels[parts[0]] = True
        rows.setdefault(("stage", "cp -r", ""), {})[parts[0]] = (None, float(parts[3]), 0.0)
    elif len(parts) == 8:
        label, fw, fmt, epoch = parts[:4]
        labels[label] = True
        rows.setdefault((fw, fmt, epoch), {})[label] = (float(parts[4]), float(parts[5]), float(parts[6]))

order = [label for label in ("ext4", "cairn") if label in labels] + [l for l in labels if l not in ("ext4", "cairn")]
peers = [label for label in order if label not in ("ext4", "cairn")]


def ratio(values, other):
    if "cairn" not in values or other is None or other == 0:
        return ""
    return f"{values['cairn'] / other:.2f}"


def table(title, keys, pick, unit):
    print(f"\n{title}\n")
    print("| job | " + " | ".join(order) + " | Cairn / ext4 | Cairn / best peer |")
    print("|---" * (len(order) + 3) + "|")
    for key in keys:
        values = {label: pick(v) for label, v in rows[key].items()}
        fw, fmt, epoch = key
        name = "stage the dataset (cp -r), MiB/s" if fw == "stage" else f"{fw} {FORMATS.get(fmt, fmt)}, {EPOCHS.get(epoch, epoch)}"
        cells = [f"{values[label]:.{unit}f}" if label in values else "–" for label in order]
        best = max((values[p] for p in peers if p in values), default=None)
        print(f"| {name} | " + " | ".join(cells) + f" | {ratio(values, values.get('ext4'))} | {ratio(values, best)} |")


keys = [k for k in rows if k[2] != "accel"]
table("Samples/s (stage row: MiB/s)", keys, lambda v: v[1] if v[0] is None else v[0], 0)
table("MiB/s", [k for k in keys if k[0] != "stage"], lambda v: v[1], 1)
accel = [k for k in rows if k[2] == "accel"]
if accel:
    table("Emulated accelerator utilisation, % (cold cache)", accel, lambda v: v[2], 1)
