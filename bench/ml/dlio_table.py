#!/usr/bin/env python3
"""bench/ml/dlio_table.py: the results of bench/ml/dlio.sh.

  dlio_table.py add RESULTS LABEL WORKLOAD OUTPUT DATASET
      appends one line per epoch of the DLIO run whose output folder is OUTPUT:
      "LABEL WORKLOAD ACCELERATORS EPOCH STEPS AU% SAMPLES/S MIB/S". AU and samples/s are DLIO's
      own (summary.json: AU averaged over the accelerators, samples/s summed); STEPS is the number
      of batches each accelerator trained on (0_output.json). MiB/s is samples/s times the mean
      sample size of the training files in DATASET: DLIO's own MB/s uses the workload's nominal
      record_length, not the files it generated.
  dlio_table.py RESULTS
      prints Markdown tables from those lines and the "LABEL WORKLOAD stage MIB/S" lines of the
      dataset copies: rows are workload x accelerators x epoch, columns the filesystems (ext4
      first), then Cairn's ratio to ext4 and to the best peer (the best of every other column but
      ext4). Higher is better everywhere. A run of fewer than 2 steps (batches per accelerator)
      has no AU: DLIO's AU leaves out the first step. Last, how many of the swept accelerators each
      filesystem kept at AU >= 90% (MLPerf Storage's bar)."""
import json
import os
import sys
from collections import OrderedDict

AU_BAR = 90.0


def add(results, label, workload, output, dataset):
    summary = json.load(open(os.path.join(output, "summary.json")))
    rank0 = json.load(open(os.path.join(output, "0_output.json")))
    metric = summary["metric"]
    train = os.path.join(dataset, "train")
    files = sorted(os.listdir(train))[: summary["num_files_train"]]
    size = sum(os.path.getsize(os.path.join(train, f)) for f in files)
    sample = size / (len(files) * summary["num_samples_per_file"])
    n = summary["num_accelerators"]
    with open(results, "a") as out:
        for i, (au, rate) in enumerate(zip(metric["train_au_percentage"],
                                           metric["train_throughput_samples_per_second"]), 1):
            steps = sum(len(v) for v in rank0[str(i)]["proc"].values())
            if steps < 2:
                au = float("nan")  # DLIO's AU leaves out the first batch: it says 0 here
            out.write(f"{label} {workload} {n} epoch{i} {steps} {au:.2f} {rate:.2f} {rate * sample / 2**20:.1f}\n")


def table(results):
    rows = OrderedDict()  # (workload, accelerators, epoch) -> {label: (steps, au, samples/s, MiB/s)}
    stage = OrderedDict()  # workload -> {label: MiB/s}
    labels = OrderedDict()
    for line in open(results):
        parts = line.split()
        if len(parts) == 4 and parts[2] == "stage":
            labels[parts[0]] = True
            stage.setdefault(parts[1], {})[parts[0]] = float(parts[3])
        elif len(parts) == 8:
            label, workload, n, epoch = parts[:4]
            labels[label] = True
            rows.setdefault((workload, int(n), epoch), {})[label] = (
                int(parts[4]), float(parts[5]), float(parts[6]), float(parts[7]))
    order = [l for l in ("ext4", "cairn") if l in labels] + [l for l in labels if l not in ("ext4", "cairn")]
    peers = [l for l in order if l not in ("ext4", "cairn")]

    def ratio(values, other):
        if "cairn" not in values or other is None or other == 0:
            return ""
        return f"{values['cairn'] / other:.2f}"

    def line(name, values, digits):
        values = {l: v for l, v in values.items() if v == v}  # NaN: an AU of fewer than 2 batches
        cells = [f"{values[l]:.{digits}f}" if l in values else "–" for l in order]
        best = max((values[p] for p in peers if p in values), default=None)
        print(f"| {name} | " + " | ".join(cells) + f" | {ratio(values, values.get('ext4'))} | {ratio(values, best)} |")

    def header(title, first):
        print(f"\n{title}\n")
        print(f"| {first} | " + " | ".join(order) + " | Cairn / ext4 | Cairn / best peer |")
        print("|---" * (len(order) + 3) + "|")

    def name(key):
        workload, n, epoch = key
        steps = sorted({v[0] for v in rows[key].values()})
        each = "/".join(str(s) for s in steps)
        number = epoch[len("epoch"):]
        return (f"{workload}, {n} accelerator{'s' if n > 1 else ''} ({each} step{'' if each == '1' else 's'} each), "
                f"epoch {number}{' (cold)' if number == '1' else ''}")

    for title, pick, digits in (("Accelerator utilisation (AU), % (MLPerf Storage asks ≥ 90; –: under 2 steps)", 1, 1),
                                ("Samples/s, all accelerators", 2, 1),
                                ("MiB/s, all accelerators (stage rows: the dataset's `cp -r` from ext4)", 3, 0)):
        header(title, "workload, accelerators, epoch")
        for key, values in rows.items():
            line(name(key), {l: v[pick] for l, v in values.items()}, digits)
        if pick == 3:
            for workload, values in stage.items():
                line(f"{workload}, stage (cp -r)", values, 0)

    # The most accelerators of the sweep that kept AU >= 90%, per workload and epoch.
    fed = OrderedDict()
    for (workload, n, epoch), values in rows.items():
        cell = fed.setdefault((workload, epoch), {l: 0 for l in order})
        for l, v in values.items():
            if v[1] >= AU_BAR:
                cell[l] = max(cell[l], n)
    sweep = sorted({n for _, n, _ in rows})
    header(f"Accelerators fed at AU ≥ 90% (most of {' '.join(map(str, sweep))}; 0: none)", "workload, epoch")
    for (workload, epoch), values in fed.items():
        line(f"{workload}, epoch {epoch[len('epoch'):]}", values, 0)


if __name__ == "__main__":
    if len(sys.argv) == 7 and sys.argv[1] == "add":
        add(*sys.argv[2:])
    elif len(sys.argv) == 2:
        table(sys.argv[1])
    else:
        sys.exit(__doc__)
