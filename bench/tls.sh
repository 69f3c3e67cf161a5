#!/usr/bin/env bash
# bench/tls.sh [ROUNDS]: what mutual TLS costs. Alternates, in one session (this VM drifts by
# ±20% between runs), a fresh `cairn up --plaintext` and a fresh `cairn up` (TLS, the default),
# each running the same jobs on its mount:
#   - a SZ file (default 512m) written with 1 MiB writes and --end_fsync=1, then read cold
#     (page cache dropped) twice;
#   - N (default 2000) 4 KiB files written, then read cold, one open/read/close each.
# Prints "LABEL JOB VALUE UNIT" lines; bench/RESULTS.md has a run with its command.
#   cargo build --release -p cairn && bench/tls.sh 2
set -euo pipefail
rounds=${1:-2}
sz=${SZ:-512m}
n=${N:-2000}
cairn=${CAIRN:-target/release/cairn}
work=${WORK:-/var/tmp/cairn-tls}
[ "$(id -u)" -eq 0 ] || { echo "bench/tls.sh: run as root" >&2; exit 1; }
command -v fio >/dev/null || { echo "bench/tls.sh: needs fio (apt-get install fio)" >&2; exit 1; }
mibs() { python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; print(round((j["read"]["bw_bytes"]+j["write"]["bw_bytes"])/2**20))'; }
files_per_s() { python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; d=j["read"] if j["read"]["io_bytes"] else j["write"]; print(round('"$n"' / (d["runtime"] / 1000)))'; }
small() { # rw
  fio --name=small --directory="$work/mnt/small" --rw="$1" --bs=4k --filesize=4k --nrfiles="$n" \
    --openfiles=1 --file_service_type=sequential --create_on_open=1 --fallocate=none --output-format=json
}
one() { # label, extra `cairn up` flags
  local label=$1; shift
  rm -rf "$work"; mkdir -p "$work/mnt"
  "$cairn" up --data-dir "$work/data" --mount "$work/mnt" --meta-port 0 "$@" > "$work.log" 2>&1 &
  local pid=$!
  for _ in $(seq 600); do grep -q "^ready" "$work.log" && break; sleep 0.1; done
  grep -q "^ready" "$work.log" || { cat "$work.log" >&2; kill -INT $pid; return 1; }
  echo "$label seq-write $(fio --name=w --directory="$work/mnt" --rw=write --bs=1M --size="$sz" --filename=big --end_fsync=1 --output-format=json | mibs) MiB/s"
  for _ in 1 2; do
    sync; echo 3 > /proc/sys/vm/drop_caches
    echo "$label seq-read-cold $(fio --name=r --directory="$work/mnt" --rw=read --bs=1M --size="$sz" --filename=big --output-format=json | mibs) MiB/s"
  done
  mkdir -p "$work/mnt/small"
  echo "$label 4k-files-write $(small write | files_per_s) files/s"
  sync; echo 3 > /proc/sys/vm/drop_caches
  echo "$label 4k-files-read-cold $(small read | files_per_s) files/s"
  kill -INT $pid; wait $pid || true
}
for _ in $(seq "$rounds"); do one plaintext --plaintext; one tls; done
rm -rf "$work" "$work.log"
