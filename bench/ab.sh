#!/usr/bin/env bash
# bench/ab.sh BIN_A BIN_B [ROUNDS]: two builds of `cairn` on the same job, alternated, in one
# session (this VM drifts by ±20% between runs, so A/B only within one invocation). Each round
# starts a fresh `cairn up` per build, writes a SZ file (default 512m) with 1 MiB writes, then
# reads it cold (page cache dropped) three times. Prints "LABEL write|read MiB/s" lines. With
# RR=SECONDS, then 4 KiB random reads of it from 4 jobs for that long, with O_DIRECT so every read
# reaches the client rather than the page cache ("LABEL randread4k IOPS").
#   cp target/release/cairn /tmp/cairn-before; (change, build); bench/ab.sh /tmp/cairn-before target/release/cairn
set -euo pipefail
a=$1 b=$2 rounds=${3:-2}
sz=${SZ:-512m}
work=${WORK:-/var/tmp/cairn-ab}
[ "$(id -u)" -eq 0 ] || { echo "bench/ab.sh: run as root" >&2; exit 1; }
mibs() { python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; print(round((j["read"]["bw_bytes"]+j["write"]["bw_bytes"])/2**20))'; }
one() { # bin label
  rm -rf "$work"; mkdir -p "$work/mnt"
  "$1" up --data-dir "$work/data" --mount "$work/mnt" --meta-port 0 > "$work.log" 2>&1 &
  local pid=$!
  for _ in $(seq 600); do grep -q "^ready" "$work.log" && break; sleep 0.1; done
  grep -q "^ready" "$work.log" || { cat "$work.log" >&2; kill -INT $pid; return 1; }
  echo "$2 write $(fio --name=w --directory="$work/mnt" --rw=write --bs=1M --size="$sz" --filename=big --end_fsync=1 --output-format=json | mibs)"
  for _ in 1 2 3; do
    sync; echo 3 > /proc/sys/vm/drop_caches
    echo "$2 read $(fio --name=r --directory="$work/mnt" --rw=read --bs=1M --size="$sz" --filename=big --output-format=json | mibs)"
  done
  if [ -n "${RR:-}" ]; then
    sync; echo 3 > /proc/sys/vm/drop_caches
    echo "$2 randread4k $(fio --name=rr --directory="$work/mnt" --rw=randread --bs=4k --size="$sz" --filename=big \
      --direct=1 --numjobs=4 --time_based --runtime="$RR" --group_reporting --output-format=json \
      | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["read"]["iops"]))')"
  fi
  kill -INT $pid; wait $pid || true
}
for _ in $(seq "$rounds"); do one "$a" A; one "$b" B; done
rm -rf "$work" "$work.log"
