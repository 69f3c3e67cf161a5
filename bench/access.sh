#!/usr/bin/env bash
# bench/access.sh [ROUNDS]: what an access rule costs a client held to it. One `cairn up`
# cluster, two mounts of it: the cluster's own (certificate `client`, no rule names it) and one
# with a certificate `squashed` that a rule holds to `squash = "root"` (with the defaults
# setuid = false, devices = false: every create maps owners and modes, every commit first looks
# at the file's owner, mode and security.capability). Alternates, ROUNDS times, N (default
# 2000) 4 KiB files written on each mount (fio, one open/write/close each).
# Prints "LABEL 4k-files-write VALUE files/s"; bench/RESULTS.md has a run with its command.
#   cargo build --release -p cairn && bench/access.sh 3
set -euo pipefail
rounds=${1:-3}
n=${N:-2000}
cairn=${CAIRN:-target/release/cairn}
work=${WORK:-/var/tmp/cairn-access}
[ "$(id -u)" -eq 0 ] || { echo "bench/access.sh: run as root" >&2; exit 1; }
command -v fio >/dev/null || { echo "bench/access.sh: needs fio (apt-get install fio)" >&2; exit 1; }
files_per_s() { python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; print(round('"$n"' / (j["write"]["runtime"] / 1000)))'; }
rm -rf "$work"; mkdir -p "$work/mnt" "$work/sq"
"$cairn" up --data-dir "$work/data" --mount "$work/mnt" --meta-port 0 > "$work.log" 2>&1 &
up=$!
mount_pid=
stop() {
  [ -n "$mount_pid" ] && kill -TERM "$mount_pid" 2>/dev/null && wait "$mount_pid" 2>/dev/null
  kill -INT $up 2>/dev/null; wait $up 2>/dev/null || true
  rm -rf "$work" "$work.log" "$work.mount.log"
}
trap stop EXIT
for _ in $(seq 600); do grep -q "^ready" "$work.log" && break; sleep 0.1; done
grep -q "^ready" "$work.log" || { cat "$work.log" >&2; exit 1; }
meta=$(sed -n 's/^ready: .* from metaserver \([^ ]*\) .*/\1/p' "$work.log")
"$cairn" cert issue --ca "$work/data/tls/ca" --role client --name squashed "$work/tls-squashed" > /dev/null
printf '[[rule]]\nclients = ["squashed"]\nsquash = "root"\n' > "$work/data/access.toml.new"
mv "$work/data/access.toml.new" "$work/data/access.toml"
pkill -HUP -f "cairn meta --config $work/data" || true
sleep 1
CAIRN_TLS="$work/tls-squashed" "$cairn" mount --meta "$meta" "$work/sq" > "$work.mount.log" 2>&1 &
mount_pid=$!
for _ in $(seq 300); do grep -q " $work/sq " /proc/mounts && break; sleep 0.1; done
small() { # dir
  mkdir -p "$1"
  fio --name=small --directory="$1" --rw=write --bs=4k --filesize=4k --nrfiles="$n" \
    --openfiles=1 --file_service_type=sequential --create_on_open=1 --fallocate=none --output-format=json
}
for r in $(seq "$rounds"); do
  echo "no-rule 4k-files-write $(small "$work/mnt/plain-$r" | files_per_s) files/s"
  echo "squash-root 4k-files-write $(small "$work/sq/squashed-$r" | files_per_s) files/s"
done
owner=$(stat -c %u "$work/sq/squashed-1/small.0.0")
echo "files written through the squashed mount are owned by uid $owner"
