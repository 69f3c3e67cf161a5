#!/usr/bin/env bash
# bench/write_back.sh [ROUNDS]: what write-back costs writers. One session, alternated: a fresh
# `cairn up` (release build) per mount setting — write-back off (commit_interval_ms=0), the
# default (5000) and a short interval (1000) — plus local ext4 as the baseline. Each runs a
# sequential 1 MiB write of SZ (default 2g, long enough for several intervals) with
# --end_fsync=1, then SMALL (default 1000) 128 KiB files written (fio keeps all of them open
# until the job ends). Prints "LABEL JOB MiB/s IOPS" lines (IOPS of 128 KiB files = files/s),
# and the mount's write-back commits. Run as root.
#   cargo build --release -p cairn && bench/write_back.sh 2
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
rounds=${1:-2}
sz=${SZ:-2g} small=${SMALL:-1000}
work=${WORK:-/var/tmp/cairn-wb}
cairn=${CAIRN:-$repo/target/release/cairn}
[ "$(id -u)" -eq 0 ] || { echo "bench/write_back.sh: run as root" >&2; exit 1; }
command -v fio >/dev/null || apt-get install -y -q fio

rates() { # label job json
  python3 - "$@" <<'PY'
import json, sys
label, job, path = sys.argv[1:4]
j = json.load(open(path))["jobs"][0]["write"]
print(f"{label} {job} {j['bw_bytes'] / 2**20:.1f} {j['iops']:.0f}")
PY
}

jobs() { # dir label
  local json=$work/fio.json
  fio --name=seqwrite --directory="$1" --rw=write --bs=1M --size="$sz" --end_fsync=1 --filename=big \
    --output-format=json > "$json" && rates "$2" seqwrite "$json"
  rm -f "$1/big"
  fio --name=smallwrite --directory="$1" --rw=write --bs=128k --nrfiles="$small" --filesize=128k \
    --size=$((small * 128))k --create_on_open=1 --file_service_type=sequential \
    --filename_format='small.$filenum' --output-format=json > "$json" && rates "$2" "smallwrite" "$json"
  sync; echo 3 > /proc/sys/vm/drop_caches
}

cairn_run() { # interval_ms label
  rm -rf "$work/data" "$work/mnt"; mkdir -p "$work/mnt"
  "$cairn" up --data-dir "$work/data" --mount "$work/mnt" --meta-port 0 --commit-interval-ms "$1" \
    > "$work/up.log" 2>&1 &
  local pid=$!
  for _ in $(seq 600); do grep -q "^ready" "$work/up.log" && break; sleep 0.1; done
  grep -q "^ready" "$work/up.log" || { cat "$work/up.log" >&2; kill -INT $pid; return 1; }
  jobs "$work/mnt" "$2"
  local metrics; metrics=$(awk '$1 == "mount" { print $5 }' "$work/up.log")
  echo "$2 write-back-commits $(curl -s "http://$metrics/metrics" | awk '/^cairn_client_write_back_commits_total/ { print $2 }')"
  kill -INT $pid; wait $pid || true
}

rm -rf "$work"; mkdir -p "$work/ext4"
for _ in $(seq "$rounds"); do
  jobs "$work/ext4" ext4; rm -rf "${work:?}/ext4/"*
  cairn_run 0 cairn-wb-off
  cairn_run 5000 cairn-wb-5s
  cairn_run 1000 cairn-wb-1s
done
rm -rf "$work"
