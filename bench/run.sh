#!/usr/bin/env bash
# bench/run.sh: Cairn beside local ext4 and the peers installed on this machine, same jobs, one
# run, one table (bench/fio.sh data-path jobs, bench/mdbench.py metadata rates; bench/table.py
# prints ratios to ext4 and to the best peer). Run as root (page-cache drops, FUSE, peers).
#
#   bench/run.sh                          # Cairn (release build, `cairn up` 6 x 4+2) and ext4
#   PEERS="moosefs juicefs gluster" bench/run.sh
#   SZ=1g RT=15 SMALL=2000 MDN=10000 PEERS=... bench/run.sh
#
# Peers are started with the scripts in $PEERS_DIR (default ../shared/peers next to this
# repository), which install their Debian or PyPI packages on first use; a peer that cannot be
# started is reported and left out. Everything lives under $WORK (default /var/tmp/cairn-bench,
# on the same disk as ext4's directory). Results: $WORK/results.txt and the table on stdout.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${WORK:-/var/tmp/cairn-bench}
peers=${PEERS:-}
export SZ=${SZ:-1g} RT=${RT:-15} SMALL=${SMALL:-2000}
mdn=${MDN:-10000}
[ "$(id -u)" -eq 0 ] || { echo "bench/run.sh: run as root (drops the page cache, mounts FUSE)" >&2; exit 1; }
command -v fio >/dev/null || apt-get install -y -q fio

cd "$repo"
cargo build --release -q -p cairn
. bench/lib.sh

rm -rf "$work"
mkdir -p "$work/ext4" "$work/mnt"
results=$work/results.txt
: > "$results"

run_on() { # dir label
  echo "== $2 ($1)"
  bench/fio.sh "$1" "$2" "$results"
  python3 bench/mdbench.py "$1" "$2" "$results" "$mdn"
}

# Local ext4 (the baseline on the same disk), Cairn (`cairn up`: 4+2, 1 MiB units), the peers.
on_every_system run_on

echo
echo "$(date -u +%F), $(nproc) cores, SZ=$SZ RT=$RT SMALL=$SMALL MDN=$mdn, commit $(git rev-parse --short HEAD)"
python3 bench/table.py "$results"
