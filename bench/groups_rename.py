#!/usr/bin/env python3
"""bench/groups_rename.py SAME OTHER_SAME ACROSS N: the latency of renames of files within one
metadata group and across two, on a mount of a cluster split over groups (bench/groups.sh
prepares it). SAME and OTHER_SAME are two directories of one group, ACROSS one of another
group. N empty files are made in SAME, then each is renamed, one at a time, four times:

  same dir      SAME/f  -> SAME/s          (one group, one directory)
  same group    SAME/s  -> OTHER_SAME/s    (one group, two directories)
  across        OTHER_SAME/s -> ACROSS/x   (the file's group and the source's coordinate; the
                                            destination's group takes part)
  back          ACROSS/x -> SAME/y         (coordinated by the other group)

Prints, for each, the median, 90th and 99th percentile latency in microseconds and the rate,
then the ratios across / same group of the medians."""
import os
import statistics
import sys
import time


def timed(pairs):
    out = []
    for src, dst in pairs:
        t = time.perf_counter()
        os.rename(src, dst)
        out.append((time.perf_counter() - t) * 1e6)
    return out


def line(name, lat):
    lat = sorted(lat)
    q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))]
    total = sum(lat) / 1e6
    print(f"{name:<11} median {statistics.median(lat):8.0f} µs  p90 {q(0.9):8.0f} µs  "
          f"p99 {q(0.99):8.0f} µs  {len(lat) / total:7.0f} renames/s")
    return statistics.median(lat)


def main():
    same, other, across, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    for i in range(n):
        with open(os.path.join(same, f"f{i}"), "w"):
            pass
    j = os.path.join
    med = {}
    med["same dir"] = line("same dir", timed((j(same, f"f{i}"), j(same, f"s{i}")) for i in range(n)))
    med["same group"] = line("same group", timed((j(same, f"s{i}"), j(other, f"s{i}")) for i in range(n)))
    med["across"] = line("across", timed((j(other, f"s{i}"), j(across, f"x{i}")) for i in range(n)))
    med["back"] = line("back", timed((j(across, f"x{i}"), j(same, f"y{i}")) for i in range(n)))
    for name in ("across", "back"):
        print(f"{name} / same group (medians): {med[name] / med['same group']:.2f}")
    for i in range(n):
        os.unlink(j(same, f"y{i}"))


main()
