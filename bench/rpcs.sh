#!/usr/bin/env bash
# bench/rpcs.sh [N] [cairn up flags...]: metadata round trips per file operation. Starts a fresh
# `cairn up` (release build), runs N (default 2000) creates, stats (then again once the kernel's
# entries expired), listings, 4 KiB file writes, cold 4 KiB file reads and unlinks through the
# mount, and prints for each phase its rate and the
# requests per operation the metaserver counted (`cairn_rpc_requests_total`) and the FUSE
# requests the client counted (`cairn_client_fuse_ops_total`). CAIRN_BIN=PATH runs another build
# (an older one, to compare); RPCS_AS_UID=N runs the file operations as that user (the
# metaserver then checks each request as that user); RPCS_SUBTREE=D runs them on a second mount whose
# client certificate an access rule limits to a directory D levels deep (the metaserver then
# checks every inode it names against that subtree; with RPCS_SUBTREE_OFF=1 the same mount and
# directory, the rule's subtree "/": the baseline). With replicated metaservers it also prints the mean Raft commit
# time on the first replica.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
n=${1:-2000}; shift || true
work=${WORK:-/var/tmp/cairn-rpcs}
[ "$(id -u)" -eq 0 ] || { echo "bench/rpcs.sh: run as root" >&2; exit 1; }
cd "$repo"
bin=${CAIRN_BIN:-}
if [ -z "$bin" ]; then cargo build --release -q -p cairn; bin=target/release/cairn; fi
rm -rf "$work"; mkdir -p "$work/mnt"
"$bin" up --data-dir "$work/data" --mount "$work/mnt" --meta-port 0 "$@" > "$work/up.log" 2>&1 &
export CAIRN_TLS="$work/data/tls/admin"  # admin commands and rpc-latency (cairn up makes it)
pid=$!
trap 'kill -INT $pid; wait $pid || true; rm -rf "$work"' EXIT
for _ in $(seq 600); do grep -q "^ready" "$work/up.log" && break; sleep 0.1; done
meta=$(awk '/^meta /{print $5; exit}' "$work/up.log")  # the first replica's metrics
mount=$(awk '/^mount /{print $5}' "$work/up.log")
target="$work/mnt"
if [ -n "${RPCS_SUBTREE:-}" ]; then
  sub=$(seq -s / "$RPCS_SUBTREE" | sed 's|[0-9][0-9]*|d&|g')
  mkdir -p "$work/mnt/$sub"; chmod 777 "$work/mnt/$sub"
  "$bin" cert issue --role client --name limited --ca "$work/data/tls/ca" "$work/tls-limited" >/dev/null
  top="/$sub"; [ -z "${RPCS_SUBTREE_OFF:-}" ] || top=/
  printf '[[rule]]\nclients = ["limited"]\nsubtree = "%s"\n' "$top" > "$work/data/access.toml.new"
  mv "$work/data/access.toml.new" "$work/data/access.toml"
  pkill -HUP -f "cairn meta .*$work/data" || true; sleep 6  # re-read (at once on SIGHUP, else within 5 s)
  mkdir -p "$work/sub"; port=$((20000 + RANDOM % 10000))
  CAIRN_TLS="$work/tls-limited" "$bin" mount --meta "$(awk '/^meta /{printf "%s%s", s, $3; s=","}' "$work/up.log")" \
    --metrics "127.0.0.1:$port" "$work/sub" > "$work/sub.log" 2>&1 &
  for _ in $(seq 300); do mountpoint -q "$work/sub" && break; sleep 0.1; done
  trap 'umount "$work/sub" 2>/dev/null; kill -INT $pid; wait $pid || true; rm -rf "$work"' EXIT
  target="$work/sub"; [ "$top" != / ] || target="$work/sub/$sub"
  mount="127.0.0.1:$port"
  [ "$(ls "$target")" = "" ] || { echo "the limited mount does not show its subtree" >&2; exit 1; }
fi
python3 bench/rpcs.py "$target" "$meta" "$mount" "$n"
# With replicated metaservers: how long the first replica (the founder, which usually leads) took
# from proposing a change to having it applied, against the creates' rate above, and what that
# is made of: its own log appends (write and fsync) and its appends' round trips to followers.
python3 - "$meta" <<'PY'
import sys, urllib.request
try:
    text = urllib.request.urlopen(f"http://{sys.argv[1]}/metrics", timeout=5).read().decode()
except OSError as e:
    sys.exit(f"no metrics from {sys.argv[1]}: {e}")
sums, counts = {}, {}
for line in text.splitlines():
    name = line.split("{")[0].split(" ")[0]
    for part, into in (("_sum", sums), ("_count", counts)):
        if name.endswith(part):
            base = name[: -len(part)]
            into[base] = into.get(base, 0) + float(line.split()[-1])  # summed over labels
what = [
    ("cairn_meta_raft_commit_seconds", "raft commits", "from proposal to applied"),
    ("cairn_meta_raft_log_append_seconds", "its log appends", "written and fsynced"),
    ("cairn_meta_raft_append_rpc_seconds", "its appends to followers", "from sending to the answer"),
]
for name, label, meaning in what:
    if counts.get(name):
        mean = sums[name] / counts[name] * 1000
        print(f"first replica, {label}: {int(counts[name])}, mean {mean:.3f} ms {meaning}")
PY
