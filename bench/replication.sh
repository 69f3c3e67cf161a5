#!/usr/bin/env bash
# bench/replication.sh [PROCS...]: what replicating the metaservers costs when several processes
# create at once, against one process. For --meta-replicas 1, then 3, in one run (a fresh
# `cairn up`, release build, each time): for each PROCS (default "1 4 16") runs
# `bench/creates.py MNT PROCS N` (each process creates N empty files in a directory of its own;
# N = 8000 / PROCS); then, with the largest PROCS, `bench/meta_load.py` (creates, stats once the
# kernel's entries expired, unlinks, 4 KiB file writes). Prints one line per run and the
# 3-replica / 1-replica ratios. CAIRN_BIN=PATH runs another build.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
procs=("${@:-1 4 16}"); read -r -a procs <<< "${procs[*]}"
work=${WORK:-/var/tmp/cairn-replication}
[ "$(id -u)" -eq 0 ] || { echo "bench/replication.sh: run as root" >&2; exit 1; }
cd "$repo"
if [ -z "${CAIRN_BIN:-}" ]; then cargo build --release -q -p cairn; fi
source bench/lib.sh
rm -rf "$work"; mkdir -p "$work"
declare -A rate
for replicas in 1 3; do
  cairn_start "$work/mnt" --meta-replicas "$replicas"
  for p in "${procs[@]}"; do
    line=$(python3 bench/creates.py "$work/mnt" "$p" $((8000 / p)))
    echo "replicas $replicas: $line"
    rate[$replicas,$p]=$(awk '{print $3}' <<< "$line")
  done
  most=${procs[-1]}
  while read -r op r; do
    echo "replicas $replicas: $most processes: $op $r"
    rate[$replicas,$op]=${r%/s}
  done < <(python3 bench/meta_load.py "$work/mnt" "$most" $((8000 / most)))
  cairn_stop
  rm -rf "$work/cairn"
done
for p in "${procs[@]}"; do
  awk -v p="$p" -v a="${rate[1,$p]}" -v b="${rate[3,$p]}" \
    'BEGIN { printf "%s processes: 1 replica %d/s, 3 replicas %d/s, 3 / 1 = %.2f\n", p, a, b, b / a }'
done
for op in create stat unlink write4k; do
  awk -v op="$op" -v p="${procs[-1]}" -v a="${rate[1,$op]}" -v b="${rate[3,$op]}" \
    'BEGIN { printf "%s processes, %s: 1 replica %d/s, 3 replicas %d/s, 3 / 1 = %.2f\n", p, op, a, b, b / a }'
done
rm -rf "$work"
