#!/usr/bin/env bash
# bench/failover.sh [KILLS] [cairn up flags...]: how long a mount waits when the metaserver
# leader dies. Starts `cairn up --meta-replicas 3` (release build), then KILLS times (default 20):
# finds the leader with `cairn meta status --json`, kills it with SIGKILL, and times from the
# kill to the first create that succeeds on the mount (a fresh name each time; the loop creates
# one file after another, as a busy application would); then starts the killed replica again
# and waits until it has caught up. Prints every time and the p50, p90 and p99. OP=mkdir times
# the first mkdir instead (no chunkserver placement: the metaserver alone).
# CAIRN_BIN=PATH runs another build.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
kills=${1:-20}; shift || true
work=${WORK:-/var/tmp/cairn-failover}
[ "$(id -u)" -eq 0 ] || { echo "bench/failover.sh: run as root" >&2; exit 1; }
cd "$repo"
bin=${CAIRN_BIN:-}
if [ -z "$bin" ]; then cargo build --release -q -p cairn; bin=target/release/cairn; fi
rm -rf "$work"; mkdir -p "$work/mnt"
"$bin" up --data-dir "$work/data" --mount "$work/mnt" --meta-port 0 --meta-replicas 3 "$@" > "$work/up.log" 2>&1 &
export CAIRN_TLS="$work/data/tls/admin"  # for the admin commands below (cairn up makes it)
pid=$!
trap 'pkill -f "$work/data/meta-" || true; kill -INT $pid; wait $pid || true; rm -rf "$work"' EXIT
for _ in $(seq 600); do grep -q "^ready" "$work/up.log" && break; sleep 0.1; done
export CAIRN_META
CAIRN_META=$(sed -n 's/^ready: .* metaserver \([^; ]*\)[; ].*/\1/p' "$work/up.log")
python3 - "$bin" "$work" "$kills" "${OP:-create}" <<'EOF'
import json, os, signal, subprocess, sys, time

binary, work, kills, op = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
mnt = os.path.join(work, "mnt")

def status():
    out = subprocess.run([binary, "meta", "status", "--json"], capture_output=True, text=True).stdout
    try:
        return json.loads(out)
    except ValueError:
        return {}

def pid_of(replica):
    out = subprocess.run(["pgrep", "-f", f"{work}/data/meta-{replica}/meta.toml"], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]

def caught_up():
    s = status()
    rows = [r for r in s.get("replicas", []) if "applied_index" in r]
    return s.get("leader") and len(rows) == 3 and max(r["lag"] for r in rows) <= 2

times, n = [], 0
for round in range(kills):
    while not caught_up():
        time.sleep(0.1)
    # A steady stream of creates runs before the kill, so the mount knows the leader.
    for _ in range(20):
        n += 1
        open(os.path.join(mnt, f"warm-{n}"), "w").close()
    leader = status()["leader"]
    for p in pid_of(leader):
        os.kill(p, signal.SIGKILL)
    killed = time.monotonic()
    while True:
        n += 1
        try:
            path = os.path.join(mnt, f"after-{n}")
            os.mkdir(path) if op == "mkdir" else open(path, "w").close()
            break
        except OSError as e:
            print(f"  create failed: {e}", flush=True)
    took = time.monotonic() - killed
    times.append(took)
    print(f"kill {round + 1}: replica {leader}, first {op} after {took * 1000:.0f} ms", flush=True)
    log = open(os.path.join(work, "data", "logs", f"meta-{leader}-restarted.log"), "a")
    subprocess.Popen([binary, "meta", "--config", os.path.join(work, "data", f"meta-{leader}", "meta.toml")],
                     stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)

times.sort()
q = lambda p: times[min(len(times) - 1, int(p * len(times)))]
print(f"failover ({op}) over {len(times)} kills: p50 {q(0.5) * 1000:.0f} ms, p90 {q(0.9) * 1000:.0f} ms, "
      f"p99 {q(0.99) * 1000:.0f} ms, max {times[-1] * 1000:.0f} ms")
EOF
