#!/usr/bin/env bash
# Tiering benchmark: training epochs over a dataset whose shards sit on a really slow HDD tier,
# then promoted to the SSD tier, then pulled in by `cairn warmup`; io_uring vs pread engine.
#
# How the HDD is made slow: every chunkserver's HDD directory is an ext4 filesystem on its own
# loop device (direct I/O to the backing file, so the host page cache does not stand in for
# the disk), and the cgroup v1 blkio controller throttles reads of each loop device to
# HDD_MIBS MiB/s for the cluster's processes. The cluster also runs in a memory cgroup capped
# at MEM_LIMIT, below the dataset size, and the page cache is dropped before every epoch, so
# no epoch is served from memory.
#
# Per engine: (1) start the cluster with a 1 MiB SSD cap, so every 1 MiB shard lands on HDD,
# and write two datasets of DATASET_MIB each (`train/`, `warm/`); (2) restart it with the SSD
# cap SSD_CAP (room for both); (3) epoch 1 and epoch 2 over train/ (each shard read once per
# epoch: the second HDD read makes it hot, the default policy `promote_after_reads = 2`), wait
# for the mover to finish promoting, epoch 3; (4) `cairn warmup warm/`, then an epoch over it.
# READERS files are read at once (`cat`), like a data loader's workers.
#
# Needs root, losetup, mkfs.ext4, jq and cgroup v1 blkio + memory hierarchies (mounted under
# /sys/fs/cgroup here). Run from the repository root after `cargo build --release -p cairn`:
#   bench/tiers.sh                         # both engines, about 5 minutes on 2 cores
#   ENGINES=pread DATASET_MIB=512 bench/tiers.sh
#   PROMOTE_AFTER=1 ENGINES=uring bench/tiers.sh   # promote on the first HDD read
#   DIRECT_IO=1 PROMOTE_AFTER=1 ENGINES=uring bench/tiers.sh   # HDD tier read with O_DIRECT
set -euo pipefail

CAIRN=${CAIRN:-$PWD/target/release/cairn}
WORK=${WORK:-/var/tmp/cairn-bench-tiers}
ENGINES=${ENGINES:-"uring pread"}
DATASET_MIB=${DATASET_MIB:-1024}   # per dataset (train/ and warm/)
FILE_MIB=${FILE_MIB:-64}
HDD_MIBS=${HDD_MIBS:-10}           # read throughput of each chunkserver's HDD
SSD_CAP=${SSD_CAP:-640M}           # per chunkserver; both datasets' shards fit under 90% of it
MEM_LIMIT=${MEM_LIMIT:-768M}       # memory (and so page cache) of the whole cluster
READERS=${READERS:-4}
PROMOTE_AFTER=${PROMOTE_AFTER:-2}  # the measured runs; the default policy is now 1
DIRECT_IO=${DIRECT_IO:-0}          # 1: every chunkserver reads its HDD tier with O_DIRECT
CHUNKS=6
BLKIO=/sys/fs/cgroup/blkio/cairn-bench
MEMCG=/sys/fs/cgroup/memory/cairn-bench
DATA=$WORK/data
MNT=$WORK/mnt
RESULTS=$WORK/results.tsv
UP_PID=
META=

say() { echo "[tiers $(date +%T)] $*" >&2; }
die() { say "error: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (loop devices, cgroups, drop_caches)"
[ -x "$CAIRN" ] || die "$CAIRN missing: cargo build --release -p cairn"
for tool in losetup mkfs.ext4 jq; do command -v $tool >/dev/null || die "$tool missing"; done
if [ ! -e /sys/fs/cgroup/blkio/cgroup.procs ]; then
    mkdir -p /sys/fs/cgroup/blkio
    mount -t cgroup -o blkio cgroup /sys/fs/cgroup/blkio || die "no cgroup v1 blkio controller"
fi
[ -e /sys/fs/cgroup/memory/cgroup.procs ] || die "no cgroup v1 memory controller"

stop_cluster() {
    if [ -n "$UP_PID" ] && kill -0 "$UP_PID" 2>/dev/null; then
        kill -TERM "$UP_PID"
        wait "$UP_PID" || true
    fi
    UP_PID=
}

teardown_disks() {
    for i in $(seq 1 $CHUNKS); do
        local dir=$DATA/chunk-$i/hdd
        if mountpoint -q "$dir"; then umount "$dir"; fi
    done
    for img in "$WORK"/hdd-*.img; do
        [ -e "$img" ] || continue
        losetup -j "$img" | cut -d: -f1 | while read -r dev; do losetup -d "$dev"; done
    done
}

cleanup() {
    stop_cluster
    if mountpoint -q "$MNT" 2>/dev/null; then umount -l "$MNT"; fi
    teardown_disks
    rm -f "$WORK"/hdd-*.img
    rmdir "$BLKIO" "$MEMCG" 2>/dev/null || true
}
trap cleanup EXIT

# Six ext4 loop devices, mounted as the chunkservers' HDD directories, reads throttled.
setup_disks() {
    mkdir -p "$BLKIO" "$MEMCG"
    echo "$MEM_LIMIT" >"$MEMCG/memory.limit_in_bytes"
    for i in $(seq 1 $CHUNKS); do
        local img=$WORK/hdd-$i.img dir=$DATA/chunk-$i/hdd dev mm
        rm -f "$img"
        truncate -s $((DATASET_MIB * 2 * 3 / 2 / CHUNKS + 512))M "$img"
        dev=$(losetup --direct-io=on -f --show "$img")
        mkfs.ext4 -q -E lazy_itable_init=0,lazy_journal_init=0 "$dev"
        mkdir -p "$dir"
        mount "$dev" "$dir"
        mm=$(lsblk -dno MAJ:MIN "$dev" | tr -d ' ')
        echo "$mm $((HDD_MIBS << 20))" >"$BLKIO/blkio.throttle.read_bps_device"
    done
}

start_cluster() { # ssd_capacity engine
    ( echo $BASHPID >"$BLKIO/cgroup.procs"
      echo $BASHPID >"$MEMCG/cgroup.procs"
      exec "$CAIRN" up --data-dir "$DATA" --mount "$MNT" --meta-port 0 --ssd-capacity "$1" \
          --io-engine "$2" --promote-after-reads "$PROMOTE_AFTER" \
          $([ "$DIRECT_IO" = 1 ] && echo --hdd-direct-io) ) >"$WORK/up.log" 2>&1 &
    UP_PID=$!
    export CAIRN_TLS="$DATA/tls/admin"  # admin commands (cairn up makes it)
    local deadline=$((SECONDS + 120))
    until grep -q '^ready:' "$WORK/up.log"; do
        kill -0 "$UP_PID" 2>/dev/null || { cat "$WORK/up.log" >&2; die "cairn up exited"; }
        [ $SECONDS -lt $deadline ] || die "cairn up not ready; see $WORK/up.log"
        sleep 0.2
    done
    META=$(sed -n 's/^ready: .* metaserver \([^; ]*\)[; ].*/\1/p' "$WORK/up.log")
}

df_json() { "$CAIRN" df --meta "$META" --json; }

# Shard reads so far: "all ssd" (heartbeats are 1 s apart: wait for a fresh one first).
read_counters() {
    sleep 1.5
    df_json | jq -r '[([.tiers[].reads] | add), ([.tiers[] | select(.tier == "ssd") | .reads] | add)] | @tsv'
}

drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }

epoch() { # engine label dir
    local engine=$1 label=$2 dir=$3 before after t0 t1 bytes
    drop_caches
    before=$(read_counters)
    bytes=$(du -sb --apparent-size "$dir" | cut -f1)
    t0=$(date +%s.%N)
    find "$dir" -type f -print0 | xargs -0 -P "$READERS" -n 1 cat >/dev/null
    t1=$(date +%s.%N)
    after=$(read_counters)
    awk -v e="$engine" -v l="$label" -v t0="$t0" -v t1="$t1" -v b="$bytes" -v before="$before" -v after="$after" 'BEGIN {
        split(before, x, "\t"); split(after, y, "\t")
        reads = y[1] - x[1]; ssd = y[2] - x[2]
        s = t1 - t0
        printf "%s\t%s\t%.1f\t%.0f\t%.0f%%\n", e, l, s, b / 1048576 / s, reads ? 100 * ssd / reads : 0
    }' | tee -a "$RESULTS" >&2
}

# The mover is done when the promotion count stops moving for three heartbeats.
wait_mover() {
    local last=-1 same=0 now
    while [ $same -lt 3 ]; do
        sleep 1
        now=$(df_json | jq '.promotions + .demotions')
        if [ "$now" = "$last" ]; then same=$((same + 1)); else same=0; last=$now; fi
    done
}

mkdir -p "$WORK"
: >"$RESULTS"
SRC=$WORK/src.bin
[ -s "$SRC" ] && [ "$(stat -c %s "$SRC")" = $((FILE_MIB << 20)) ] || head -c "${FILE_MIB}M" /dev/urandom >"$SRC"
say "dataset 2 x $DATASET_MIB MiB in $FILE_MIB MiB files; HDD reads $HDD_MIBS MiB/s per chunkserver; SSD cap $SSD_CAP; memory cap $MEM_LIMIT; $READERS readers"

for engine in $ENGINES; do
    cleanup
    rm -rf "$DATA" "$MNT"
    mkdir -p "$DATA" "$MNT"
    setup_disks

    say "$engine: writing both datasets with the SSD tier capped at 1 MiB (every shard to HDD)"
    start_cluster 1M "$engine"
    mkdir "$MNT/train" "$MNT/warm"
    t0=$SECONDS
    for set in train warm; do
        for i in $(seq 1 $((DATASET_MIB / FILE_MIB))); do cp "$SRC" "$MNT/$set/f$i"; done
    done
    say "$engine: wrote $((2 * DATASET_MIB)) MiB in $((SECONDS - t0)) s"
    stop_cluster

    start_cluster "$SSD_CAP" "$engine"
    ssd=$(df_json | jq '[.tiers[] | select(.tier == "ssd") | .shards] | add')
    [ "$ssd" = 0 ] || say "warning: $ssd shards on SSD before epoch 1"

    epoch "$engine" "epoch 1 (HDD)" "$MNT/train"
    if [ "$PROMOTE_AFTER" = 1 ]; then wait_mover; fi
    if [ "$PROMOTE_AFTER" = 1 ]; then
        epoch "$engine" "epoch 2 (promoted after epoch 1)" "$MNT/train"
    else
        epoch "$engine" "epoch 2 (HDD read $PROMOTE_AFTER of $PROMOTE_AFTER: promotes)" "$MNT/train"
    fi
    t0=$SECONDS
    wait_mover
    say "$engine: mover finished promoting $(df_json | jq .promotions) shards $((SECONDS - t0)) s after epoch 2"
    epoch "$engine" "epoch 3 (promoted)" "$MNT/train"

    drop_caches
    t0=$(date +%s.%N)
    "$CAIRN" warmup "$MNT/warm" | tee -a "$WORK/warmup-$engine.txt" >&2
    t1=$(date +%s.%N)
    awk -v e="$engine" -v t0="$t0" -v t1="$t1" -v mib=$((DATASET_MIB * 3 / 2)) \
        'BEGIN { printf "%s\tcairn warmup warm/ (all %d MiB of shards)\t%.1f\t%.0f\t-\n", e, mib, t1 - t0, mib / (t1 - t0) }' |
        tee -a "$RESULTS" >&2
    epoch "$engine" "epoch after warmup" "$MNT/warm"
    "$CAIRN" df --meta "$META" >"$WORK/df-$engine.txt"
    stop_cluster
done

echo
echo "| engine | run | seconds | MiB/s | SSD share of shard reads |"
echo "|---|---|---:|---:|---:|"
awk -F'\t' '{ printf "| %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5 }' "$RESULTS"
