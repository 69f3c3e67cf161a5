# Sourced by bench/run.sh and bench/ml/run.sh: start and stop Cairn (`cairn up`, release build)
# and the installed peers (with the scripts in $PEERS_DIR, default ../shared/peers next to the
# repository). Needs $repo and $work.
peers_dir=${PEERS_DIR:-$repo/../shared/peers}
glusterd_before=$(pgrep -x glusterd || true)

# cairn_start MOUNTPOINT [cairn up flags...]: a whole local cluster under $work/cairn (default
# layout 4+2, 1 MiB units), mounted; returns when it is ready. Sets $cairn_pid. Starts
# $CAIRN_BIN when set (another build), else target/release/cairn.
cairn_start() {
  local mnt=$1
  shift
  mkdir -p "$mnt"
  "${CAIRN_BIN:-$repo/target/release/cairn}" up --data-dir "$work/cairn" --mount "$mnt" --meta-port 0 "$@" > "$work/up.log" 2>&1 &
  export CAIRN_TLS="$work/cairn/tls/admin"  # admin commands (cairn up makes it)
  cairn_pid=$!
  trap cairn_stop EXIT
  for _ in $(seq 600); do grep -q "^ready" "$work/up.log" && return 0; sleep 0.1; done
  cat "$work/up.log" >&2
  return 1
}

cairn_stop() {
  [ -n "${cairn_pid:-}" ] || return 0
  kill -INT "$cairn_pid" 2>/dev/null || true
  wait "$cairn_pid" 2>/dev/null || true
  cairn_pid=
  trap - EXIT
}

# peer_start NAME: moosefs, gluster or juicefs, installed on first use; sets $peer_mnt. Fails
# (and says why) when the peer cannot be started.
peer_start() {
  local script
  case $1 in
    moosefs) script=moosefs-up.sh peer_mnt=/tmp/peers/mfs/mnt ;;
    gluster) script=gluster-up.sh peer_mnt=/tmp/peers/gl/mnt ;;
    juicefs) script=juicefs-up.sh peer_mnt=/tmp/peers/jfs/mnt ;;
    *) echo "unknown peer $1 (moosefs, gluster, juicefs)" >&2; return 1 ;;
  esac
  if [ "$1" = moosefs ] && ! command -v mfsmaster >/dev/null; then
    apt-get install -y -q moosefs-master moosefs-chunkserver moosefs-client moosefs-cli >/dev/null || true
  fi
  if [ "$1" = gluster ] && ! command -v glusterd >/dev/null; then
    apt-get install -y -q glusterfs-server glusterfs-client >/dev/null || true
  fi
  # A fresh cluster every time: state a previous run left (a MooseFS chunkserver's id from an
  # older master, say) would stop it from starting.
  peer_stop "$1"
  rm -rf "$(dirname "$peer_mnt")"
  if ! bash "$peers_dir/$script" > "$work/$1-up.log" 2>&1 || ! mountpoint -q "$peer_mnt"; then
    echo "== $1: could not start (see $work/$1-up.log); left out"
    return 1
  fi
}

peer_stop() {
  bash "$peers_dir/peers-down.sh" > /dev/null 2>&1 || true
  # peers-down.sh leaves glusterd running; stop the one this run started.
  if [ "$1" = gluster ] && [ -z "$glusterd_before" ]; then pkill -x glusterd || true; fi
}

# on_every_system FUNC: FUNC DIR LABEL on local ext4 ($work/ext4), on Cairn (`cairn up`,
# mounted at $work/mnt) and on each peer in $peers that starts, one after the other. Cairn runs
# once per mount durability in $CAIRN_DURABILITY (default "close"; "close fsync" for both), on
# a fresh cluster each time, labelled `cairn` for close and `cairn-fsync` for fsync.
on_every_system() {
  local peer mode
  mkdir -p "$work/ext4"
  "$1" "$work/ext4" ext4
  for mode in ${CAIRN_DURABILITY:-close}; do
    rm -rf "$work/cairn"
    cairn_start "$work/mnt" --durability "$mode"
    "$1" "$work/mnt" "$([ "$mode" = close ] && echo cairn || echo "cairn-$mode")"
    cairn_stop
  done
  for peer in ${peers:-}; do
    peer_start "$peer" || continue
    "$1" "$peer_mnt" "$peer"
    peer_stop "$peer"
  done
}

# Drop TensorFlow's start-up chatter from a stream (stderr of a loader).
quiet_tf() {
  grep -v -E "cpu_feature_guard|rebuild TensorFlow|oneDNN|^WARNING: All log" || true
}

drop_caches() {
  sync
  echo 3 > /proc/sys/vm/drop_caches
}

# cpu_cage NAME FRACTION PID...: puts each PID (with all its threads) into a CPU cgroup of its
# own, NAME-1, NAME-2, …, each allowed FRACTION of one core (cgroup v2 `cpu.max` where the
# unified hierarchy has the cpu controller, else v1 `cpu.cfs_quota_us`): one small node each,
# as if each process had a machine of its own. cpu_cage_free NAME removes them. CAGE_PERIOD_US
# (default 100000, the kernel's) is the period the quota is given over: a shorter one spreads a
# small quota more evenly (no 90 ms stops after a burst), nearer to a slow CPU.
cpu_cage() {
  local name=$1 fraction=$2 i=0 pid dir quota period=${CAGE_PERIOD_US:-100000}
  shift 2
  quota=$(awk -v f="$fraction" -v p="$period" 'BEGIN { printf "%d", f * p }')
  for pid in "$@"; do
    i=$((i + 1))
    if grep -qw cpu /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
      dir=/sys/fs/cgroup/$name-$i
      mkdir -p "$dir"
      echo "$quota $period" > "$dir/cpu.max"
    elif [ -d /sys/fs/cgroup/cpu ]; then
      dir=/sys/fs/cgroup/cpu/$name-$i
      mkdir -p "$dir"
      echo "$period" > "$dir/cpu.cfs_period_us"
      echo "$quota" > "$dir/cpu.cfs_quota_us"
    else
      echo "cpu_cage: no cgroup cpu controller here" >&2
      return 1
    fi
    echo "$pid" > "$dir/cgroup.procs"
  done
}

cpu_cage_free() {
  local dir
  for dir in /sys/fs/cgroup/"$1"-* /sys/fs/cgroup/cpu/"$1"-*; do
    [ -d "$dir" ] || continue
    # Whatever is still inside goes back to the root group first.
    while read -r pid; do echo "$pid" > "$(dirname "$dir")/cgroup.procs" 2>/dev/null || true; done < "$dir/cgroup.procs"
    rmdir "$dir" 2>/dev/null || true
  done
}

# groups_wait_map CAIRN META: waits (up to 20 s) until every metadata group's leader holds group
# 0's latest map (slots moved, spreading turned on).
groups_wait_map() {
  for _ in $(seq 100); do
    "$1" meta groups --json --meta "$2" | python3 -c '
import json, sys
m = json.load(sys.stdin)
sys.exit(0 if all(g["map_version"] == m["version"] for g in m["groups"]) else 1)' && return 0
    sleep 0.2
  done
}

# cpu_seconds PID...: the CPU time (user + system) the processes used so far, in seconds.
cpu_seconds() {
  local pid total=0 ticks
  ticks=$(getconf CLK_TCK)
  for pid in "$@"; do
    total=$((total + $(awk '{ print $14 + $15 }' "/proc/$pid/stat")))
  done
  awk -v t="$total" -v k="$ticks" 'BEGIN { printf "%.2f", t / k }'
}
