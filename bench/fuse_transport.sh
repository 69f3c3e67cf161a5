#!/usr/bin/env bash
# bench/fuse_transport.sh [ROUNDS]: what the FUSE transport alone costs on this machine (issue 19,
# item 4). `fuse-transport` (bench/src/fuse_transport.rs) serves an in-memory null filesystem over
# /dev/fuse (4 threads on cloned descriptors, as Cairn's mount by default, and 2) and over
# FUSE-over-io_uring (one ring per possible CPU), and loads it with null requests (fgetxattr
# answered ENODATA: one request each) and creates (open O_CREAT|O_EXCL + close: four requests),
# from 1 and 2 threads; the transports alternate within each round (default 3 rounds, 3 s each).
# Then the same load on a Cairn mount (`cairn up` defaults), for scale: how much of a Cairn
# operation the transport is. Prints every run and the median per cell. Turns
# /sys/module/fuse/parameters/enable_uring on for the run and restores it after.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
rounds=${1:-3}
secs=${SECS:-3}
work=${WORK:-/var/tmp/cairn-fuse-transport}
param=/sys/module/fuse/parameters/enable_uring
[ "$(id -u)" -eq 0 ] || { echo "bench/fuse_transport.sh: run as root" >&2; exit 1; }
[ -e "$param" ] || { echo "bench/fuse_transport.sh: this kernel has no FUSE over io_uring ($param)" >&2; exit 1; }
cd "$repo"
cargo build --release -q -p cairn-bench --bin fuse-transport
if [ -z "${CAIRN_BIN:-}" ]; then cargo build --release -q -p cairn; fi
source bench/lib.sh
rm -rf "$work"; mkdir -p "$work"
before=$(cat "$param")
restore() { echo "$before" > "$param"; cairn_stop; }
trap restore EXIT
echo Y > "$param"
tool=target/release/fuse-transport
results=$work/results
: > "$results"
for round in $(seq "$rounds"); do
  for op in null create; do
    for procs in 1 2; do
      for transport in "dev --threads 4" "dev --threads 2" "uring"; do
        # shellcheck disable=SC2086
        line=$("$tool" --transport $transport --op "$op" --procs "$procs" --secs "$secs")
        echo "round $round: $line"
        echo "$line" >> "$results"
      done
    done
  done
done
cairn_start "$work/mnt"
trap restore EXIT
for op in null create; do
  for procs in 1 2; do
    line=$("$tool" --dir "$work/mnt" --op "$op" --procs "$procs" --secs "$secs" | sed 's|transport=mount:[^ ]*|transport=cairn servers=4|')
    echo "cairn: $line"
    echo "$line" >> "$results"
  done
done
cairn_stop
python3 - "$results" <<'EOF'
import statistics, sys
cells = {}
for line in open(sys.argv[1]):
    f = dict(kv.split("=", 1) for kv in line.split())
    key = (f["op"], int(f["procs"]), f["transport"] + " " + f["servers"])
    cells.setdefault(key, []).append(f)
print(f"{'op':7} {'threads':>7} {'transport':12} {'ops/s':>9} {'CPU us/op':>10} {'switches/op':>12} {'runs':>5}")
for (op, procs, transport), runs in sorted(cells.items()):
    med = lambda k: statistics.median(float(r[k]) for r in runs)
    print(f"{op:7} {procs:>7} {transport:12} {med('ops_per_s'):>9.0f} {med('cpu_us_per_op'):>10.2f} "
          f"{med('switches_per_op'):>12.2f} {len(runs):>5}")
EOF
