#!/usr/bin/env bash
# bench/replication.sh [PROCS...]: what replicating the metaservers costs when several processes
# create at once, against one process. For --meta-replicas 1, then 3, in one run (a fresh
# `cairn up`, release build, each time): for each PROCS (default "1 4 16") runs
# `bench/creates.py MNT PROCS N` (each process creates N empty files in a directory of its own;
# N = 8000 / PROCS; SHARED=1: all of them in one directory); then, with the largest PROCS, `bench/meta_load.py` (creates, stats once the
# kernel's entries expired, unlinks, 4 KiB file writes). Prints one line per run and the
# 3-replica / 1-replica ratios. CAIRN_BIN=PATH runs another build. MOUNTS=M (default 1) mounts
# the cluster M times (each with a client certificate of its own) and spreads the creating
# processes over the mounts, as M client machines would: with SHARED=1, that is the load that
# shows whether creates in one directory wait for each other's commits (the kernel serializes
# creates in one directory of one mount anyway).
#
# NODE_CPU=FRACTION (e.g. 0.25) emulates one small machine per metaserver on this one host: each
# metaserver process runs in a CPU cgroup of its own allowed FRACTION of a core (the lone one
# too), so three replicas have three times the CPU one has, as on three machines; the
# chunkservers, the mount and the load run outside, on what is left. Every run also prints
# the metaservers' CPU time per change (the busiest one's, which is the leader's, and all of
# theirs together), read from /proc, with or without NODE_CPU.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
procs=("${@:-1 4 16}"); read -r -a procs <<< "${procs[*]}"
work=${WORK:-/var/tmp/cairn-replication}
[ "$(id -u)" -eq 0 ] || { echo "bench/replication.sh: run as root" >&2; exit 1; }
cd "$repo"
if [ -z "${CAIRN_BIN:-}" ]; then cargo build --release -q -p cairn; fi
source bench/lib.sh
rm -rf "$work"; mkdir -p "$work"
cpu_cage_free cairn-bench-meta  # left by an interrupted run
declare -A rate
for replicas in 1 3; do
  cairn_start "$work/mnt" --meta-replicas "$replicas"
  mapfile -t metas < <(pgrep -f -- "meta --config $work/cairn/")
  [ "${#metas[@]}" -eq "$replicas" ] || { echo "found ${#metas[@]} metaservers, not $replicas" >&2; exit 1; }
  if [ -n "${NODE_CPU:-}" ]; then cpu_cage cairn-bench-meta "$NODE_CPU" "${metas[@]}"; fi
  roots=$work/mnt
  for m in $(seq 2 "${MOUNTS:-1}"); do
    "${CAIRN_BIN:-target/release/cairn}" cert issue --role client --name "bench-$m" --ca "$work/cairn/tls/ca" "$work/tls-$m" > /dev/null
    mkdir -p "$work/mnt-$m"
    CAIRN_TLS="$work/tls-$m" "${CAIRN_BIN:-target/release/cairn}" mount \
      --meta "$(awk '/^meta /{printf "%s%s", s, $3; s=","}' "$work/up.log")" "$work/mnt-$m" > "$work/mount-$m.log" 2>&1 &
    for _ in $(seq 300); do mountpoint -q "$work/mnt-$m" && break; sleep 0.1; done
    mountpoint -q "$work/mnt-$m" || { cat "$work/mount-$m.log" >&2; exit 1; }
    roots+=",$work/mnt-$m"
  done
  for p in "${procs[@]}"; do
    declare -a before=()
    for pid in "${metas[@]}"; do before+=("$(cpu_seconds "$pid")"); done
    line=$(python3 bench/creates.py "$roots" "$p" $((8000 / p)))
    busiest=0 all=0
    for i in "${!metas[@]}"; do
      used=$(awk -v a="${before[$i]}" -v b="$(cpu_seconds "${metas[$i]}")" 'BEGIN { print b - a }')
      all=$(awk -v a="$all" -v u="$used" 'BEGIN { print a + u }')
      busiest=$(awk -v a="$busiest" -v u="$used" 'BEGIN { print (u > a ? u : a) }')
    done
    n=$(( (8000 / p) * p ))
    echo "replicas $replicas: $line; metaserver CPU per create: leader $(awk -v c="$busiest" -v n="$n" 'BEGIN { printf "%.0f", c * 1e6 / n }') µs, all $(awk -v c="$all" -v n="$n" 'BEGIN { printf "%.0f", c * 1e6 / n }') µs"
    rate[$replicas,$p]=$(awk '{print $(NF-1)}' <<< "$line")
  done
  most=${procs[-1]}
  while read -r op r; do
    echo "replicas $replicas: $most processes: $op $r"
    rate[$replicas,$op]=${r%/s}
  done < <(python3 bench/meta_load.py "$work/mnt" "$most" $((8000 / most)))
  for m in $(seq 2 "${MOUNTS:-1}"); do umount "$work/mnt-$m"; done
  cairn_stop
  cpu_cage_free cairn-bench-meta
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
