#!/usr/bin/env python3
"""bench/ml/read_files.py ROOT [THREADS...]: how fast the filesystem alone serves a gen.py
dataset's JPEG files — every file opened, read whole and closed by a pool of threads, in a
shuffled order, no decoding — first after a page-cache drop (root), then again warm. What a
loader gets at most from the filesystem when it has cores to spare.

  bench/ml/read_files.py /mnt/cairn/dataset 4 16
"""
import glob
import os
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor


def read(path):
    with open(path, "rb") as f:
        return len(f.read())


def main():
    root, threads = sys.argv[1], [int(t) for t in sys.argv[2:]] or [16]
    files = sorted(glob.glob(os.path.join(root, "imagenet/*/*.jpg")))
    if not files:
        sys.exit(f"no JPEG files under {root}/imagenet (run bench/ml/gen.py first)")
    random.Random(1).shuffle(files)
    for n in threads:
        for cold in (True, False):
            if cold:
                os.sync()
                with open("/proc/sys/vm/drop_caches", "w") as f:
                    f.write("3\n")
            start = time.perf_counter()
            with ThreadPoolExecutor(n) as pool:
                total = sum(pool.map(read, files))
            seconds = time.perf_counter() - start
            print(
                f"{n} threads, {'cold' if cold else 'warm'}: {len(files) / seconds:.0f} files/s, "
                f"{total / seconds / 2**20:.0f} MiB/s"
            )


if __name__ == "__main__":
    main()
