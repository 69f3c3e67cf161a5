#!/usr/bin/env bash
# bench/groups_scale.sh [GROUPS...]: how metadata rates grow with metadata groups (issue 21's
# target: 4 groups at least 3x the rate of 1 under the same CPU per metaserver). For each count of
# groups (default "1 2 4"), in one run: a fresh `cairn up --meta-groups G` (release build, three
# replicas per group as by default), the slots cut into G equal ranges (group g owns
# g*4096/G ... (g+1)*4096/G - 1; group 0 keeps the first range, slot 0 with the root among them),
# new directories spread over the groups, directories made under the root until each group has
# its share (an inode's slot is in its number: ino >> 52), and every metaserver process put in a
# CPU cgroup of its own allowed NODE_CPU of a core (default 0.1: one small machine per replica,
# so the groups' leaders, not the shared two cores, bound the rates). Then, for each count of
# loading processes in PROCS (default "8 32 128", each a multiple of every G), bench/groups_load.py
# with one process per directory, as many in each group (N files each, default 9600 / the
# count): creates, stats, opens, unlinks per second. Prints one line per phase, the CPU the
# metaservers (each group's leader apart) and the mount used, how long the most throttled cgroup
# waited and how busy the machine was; at the end each phase's best rate over the process
# counts for each G, and its ratio to the first G's. NODE_CPU="" runs without cgroups;
# CAIRN_BIN=PATH runs another build.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
counts=("${@:-1 2 4}"); read -r -a counts <<< "${counts[*]}"
procs=(${PROCS:-8 32 128})
node_cpu=${NODE_CPU-0.1}
work=${WORK:-/var/tmp/cairn-groups-scale}
[ "$(id -u)" -eq 0 ] || { echo "bench/groups_scale.sh: run as root" >&2; exit 1; }
cd "$repo"
if [ -z "${CAIRN_BIN:-}" ]; then cargo build --release -q -p cairn; fi
source bench/lib.sh
cairn=${CAIRN_BIN:-target/release/cairn}
rm -rf "$work"; mkdir -p "$work"
cpu_cage_free cairn-bench-groups  # left by an interrupted run
most=0
for p in "${procs[@]}"; do
  for g in "${counts[@]}"; do
    [ $((p % g)) -eq 0 ] || { echo "PROCS: $p is not a multiple of $g groups" >&2; exit 1; }
  done
  [ "$p" -gt "$most" ] && most=$p
done

# The metaservers' CPU time by process, for `report`.
declare -A cpu_before=()
snapshot() {
  local pid
  for pid in "${metas[@]}" "$mount_pid"; do cpu_before[$pid]=$(cpu_seconds "$pid"); done
  read -r -a stat_before < <(head -1 /proc/stat)
  for cage in /sys/fs/cgroup/cairn-bench-groups-* /sys/fs/cgroup/cpu/cairn-bench-groups-*; do
    [ -f "$cage/cpu.stat" ] && cpu_before[$cage]=$(throttled "$cage")
  done
  return 0
}

# Seconds cgroup $1 waited throttled (v2 says throttled_usec, v1 throttled_time in ns).
throttled() {
  awk '/^throttled_usec/ { printf "%.1f", $2 / 1e6 } /^throttled_time/ { printf "%.1f", $2 / 1e9 }' "$1/cpu.stat"
}

since() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

# What the metaservers (each group's busiest replica, its leader, apart), the mount and the
# machine did since `snapshot`.
report() {
  local pid group u all=0 wait=0 cage busy
  declare -A lead=()
  for pid in "${metas[@]}"; do
    group=$(tr '\0' ' ' < "/proc/$pid/cmdline" | sed -n 's|.*/meta-g\([0-9]*\)-.*|\1|p')
    u=$(since "${cpu_before[$pid]}" "$(cpu_seconds "$pid")")
    all=$(awk -v a="$all" -v u="$u" 'BEGIN { print a + u }')
    lead[${group:-0}]=$(awk -v a="${lead[${group:-0}]:-0}" -v b="$u" 'BEGIN { print (b > a ? b : a) }')
  done
  local leaders=""
  for ((k = 0; k < g; k++)); do leaders+=" $k: ${lead[$k]} s,"; done
  for cage in /sys/fs/cgroup/cairn-bench-groups-* /sys/fs/cgroup/cpu/cairn-bench-groups-*; do
    [ -f "$cage/cpu.stat" ] || continue
    u=$(since "${cpu_before[$cage]}" "$(throttled "$cage")")
    wait=$(awk -v a="$wait" -v b="$u" 'BEGIN { print (b > a ? b : a) }')
  done
  # The machine's busy share (the sleeps between phases included): /proc/stat's first line,
  # idle and iowait against all.
  read -r -a stat_after < <(head -1 /proc/stat)
  busy=$(awk -v a="${stat_before[*]:1}" -v b="${stat_after[*]:1}" 'BEGIN {
    n = split(a, x, " "); split(b, y, " ")
    for (i = 1; i <= n; i++) { d = y[i] - x[i]; total += d; if (i == 4 || i == 5) idle += d }
    printf "%.0f", 100 * (total - idle) / total }')
  echo "groups $g, $p processes: CPU: metaservers $(printf %.1f "$all") s (each group's leader:${leaders%,}), the most throttled cgroup waited $wait s; the mount $(since "${cpu_before[$mount_pid]}" "$(cpu_seconds "$mount_pid")") s; the machine ${busy}% busy"
}

declare -A best=() at=()
for g in "${counts[@]}"; do
  if [ "$g" -gt 1 ]; then cairn_start "$work/mnt" --meta-groups "$g"; else cairn_start "$work/mnt"; fi
  meta=$(sed -n 's/^ready: .* from metaserver \([^ ]*\).*/\1/p' "$work/up.log")
  if [ "$g" -gt 1 ]; then
    for ((k = 1; k < g; k++)); do
      "$cairn" meta groups move "$((k * 4096 / g))-$(((k + 1) * 4096 / g - 1))" "$k" --meta "$meta" > /dev/null
    done
    "$cairn" meta groups spread on --meta "$meta" > /dev/null
    groups_wait_map "$cairn" "$meta"
  fi
  # most / G directories in each group: dirs_K lists group K's.
  for ((k = 0; k < g; k++)); do declare -a "dirs_$k=()"; done
  made=0
  for i in $(seq 8000); do
    d=$work/mnt/d$i
    mkdir "$d"
    # The slot: the number's top 12 bits (masked: bash's arithmetic is signed).
    k=$(( (($(stat -c %i "$d") >> 52) & 4095) * g / 4096 ))
    declare -n mine="dirs_$k"
    if [ "${#mine[@]}" -lt $((most / g)) ]; then mine+=("$d"); made=$((made + 1)); fi
    unset -n mine
    [ "$made" -ge "$most" ] && break
  done
  [ "$made" -eq "$most" ] || { echo "could not spread $most directories over $g groups" >&2; exit 1; }
  mapfile -t metas < <(pgrep -f -- "meta --config $work/cairn/")
  [ "${#metas[@]}" -eq $((3 * g)) ] || { echo "found ${#metas[@]} metaservers, not $((3 * g))" >&2; exit 1; }
  mount_pid=$(pgrep -f -- " mount .*$work/mnt" | head -1)
  if [ -n "$node_cpu" ]; then cpu_cage cairn-bench-groups "$node_cpu" "${metas[@]}"; fi
  for p in "${procs[@]}"; do
    dirs=()
    for ((k = 0; k < g; k++)); do
      declare -n mine="dirs_$k"
      dirs+=("${mine[@]:0:$((p / g))}")
      unset -n mine
    done
    snapshot
    while read -r op r; do
      echo "groups $g, $p processes: $op $r"
      r=${r%/s}
      if [ "$r" -gt "${best[$g,$op]:-0}" ]; then best[$g,$op]=$r at[$g,$op]=$p; fi
    done < <(python3 bench/groups_load.py "${N:-$((9600 / p))}" "${dirs[@]}")
    report
  done
  cairn_stop
  cpu_cage_free cairn-bench-groups
  rm -rf "$work/cairn"
done
echo "== the best of ${procs[*]} processes, metaservers allowed ${node_cpu:-all} of a core each ($(nproc) cores)"
for op in create stat open unlink; do
  line="$op:"
  for g in "${counts[@]}"; do
    line+=" $g groups ${best[$g,$op]}/s (${at[$g,$op]} processes"
    [ "$g" = "${counts[0]}" ] || line+=", $(awk -v a="${best[${counts[0]},$op]}" -v b="${best[$g,$op]}" 'BEGIN { printf "%.2fx", b / a }')"
    line+="),"
  done
  echo "${line%,}"
done
rm -rf "$work"
