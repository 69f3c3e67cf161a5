#!/usr/bin/env bash
# bench/audit.sh [ROUNDS]: what the metaserver's content audit costs. Each round starts a fresh
# `cairn up` twice, once with the audit off and once with it running back to back at an
# unbounded rate (CAIRN_META_CONTENT_AUDIT_INTERVAL_MS=100, ..._SHARDS_PER_SEC=1000000), writes
# SMALL (default 2000) files of 128 KiB and one SZ (default 1g) file, then reads the big file
# cold. Prints the cold read MiB/s of both, and for the audited one how many data shards a
# second the audit checked while the read ran and while nothing else did. CAIRN_BIN=PATH
# runs another build.
set -euo pipefail
rounds=${1:-2}
bin=${CAIRN_BIN:-target/release/cairn}
sz=${SZ:-1g}
small=${SMALL:-2000}
work=${WORK:-/var/tmp/cairn-audit}
[ "$(id -u)" -eq 0 ] || { echo "bench/audit.sh: run as root" >&2; exit 1; }
mibs() { python3 -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["read"]["bw_bytes"]/2**20))'; }
# Data shards the audit checked so far, over every metaserver (only the leader audits).
audited() {
  local sum=0 v
  for addr in $(awk '$1=="meta"{print $5}' "$work.log"); do
    v=$(curl -s "http://$addr/metrics" | awk '$1=="cairn_meta_audit_shards_total"{print $2}')
    sum=$(python3 -c "print(int($sum + float('${v:-0}')))")
  done
  echo "$sum"
}
one() { # label audit-interval-ms
  rm -rf "$work"; mkdir -p "$work/mnt"
  CAIRN_META_CONTENT_AUDIT_INTERVAL_MS=$2 CAIRN_META_CONTENT_AUDIT_SHARDS_PER_SEC=1000000 \
    "$bin" up --data-dir "$work/data" --mount "$work/mnt" --meta-port 0 > "$work.log" 2>&1 &
  local pid=$!
  for _ in $(seq 600); do grep -q "^ready" "$work.log" && break; sleep 0.1; done
  grep -q "^ready" "$work.log" || { cat "$work.log" >&2; kill -INT $pid; return 1; }
  mkdir "$work/mnt/small"
  python3 -c "
import os, sys
data = os.urandom(128 << 10)
for i in range($small):
    with open(f'$work/mnt/small/f{i}', 'wb') as f:
        f.write(data)
"
  fio --name=w --directory="$work/mnt" --rw=write --bs=1M --size="$sz" --filename=big --end_fsync=1 \
    --output-format=json > /dev/null
  if [ "$2" != 0 ]; then
    local a0 a1; a0=$(audited); sleep 5; a1=$(audited)
    echo "$1 audit-idle $(( (a1 - a0) / 5 )) shards/s"
  fi
  sync; echo 3 > /proc/sys/vm/drop_caches
  local r0 r1 t0 t1 mb; r0=$(audited); t0=$(date +%s.%N)
  mb=$(fio --name=r --directory="$work/mnt" --rw=read --bs=1M --size="$sz" --filename=big --output-format=json | mibs)
  t1=$(date +%s.%N); r1=$(audited)
  echo "$1 read $mb MiB/s"
  [ "$2" = 0 ] || echo "$1 audit-during-read $(python3 -c "print(round(($r1 - $r0) / ($t1 - $t0)))") shards/s"
  kill -INT $pid; wait $pid || true
}
for _ in $(seq "$rounds"); do one off 0; one on 100; done
rm -rf "$work" "$work.log"
