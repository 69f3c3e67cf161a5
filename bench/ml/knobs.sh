#!/usr/bin/env bash
# bench/ml/knobs.sh: the measured effect of the settings docs/training.md discusses, on one Cairn
# cluster (`cairn up`, release build), with the real PyTorch DataLoader (bench/ml/torch_loader.py;
# tf.data for its parallel reads):
#   - num_workers 0, 1, 2, 4, 8 (JPEG files), and tf.data's parallel reads 4 and 16;
#   - the mount: defaults vs --read-only --attr-ttl-ms 60000, and --threads 8 (JPEG files, from a
#     second client mounted with those options);
#   - the layout of a directory of tar shards: stripe unit 256 KiB, 1 MiB (default), 4 MiB.
# Each setting: epoch 1 after a page-cache drop, then epoch 2. Run as root.
#
#   IMAGES=2000 bench/ml/knobs.sh
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
work=${WORK:-/var/tmp/cairn-knobs}
venv=${VENV:-$repo/target/ml-venv}
images=${IMAGES:-2000}
[ "$(id -u)" -eq 0 ] || { echo "bench/ml/knobs.sh: run as root" >&2; exit 1; }

cd "$repo"
bench/ml/venv.sh "$venv" all
python=$venv/bin/python
cargo build --release -q -p cairn
cairn=$repo/target/release/cairn
. bench/lib.sh

rm -rf "$work"
mkdir -p "$work"
results=$work/results.txt
: > "$results"
"$python" bench/ml/gen.py "$work/dataset" --images "$images" --formats imagenet,wds

cairn_start "$work/mnt"
meta=$(sed -n 's/.*mounted from metaserver \([^; ]*\)[; ].*/\1/p' "$work/up.log")

epochs() { # label dir format [loader flags...]
  local label=$1 dir=$2 fmt=$3
  shift 3
  "$python" bench/ml/${loader:-torch}_loader.py "$dir" --format "$fmt" --epochs 2 --drop-caches --label "$label" \
    --results "$results" "$@" 2> >(quiet_tf >&2)
}

# The dataset once, default layout (4+2, 1 MiB units).
cp -r "$work/dataset" "$work/mnt/default"
for w in 0 1 2 4 8; do epochs "workers=$w" "$work/mnt/default" imagenet --workers "$w"; done
for r in 4 16; do loader=tf epochs "tf-reads=$r" "$work/mnt/default" imagenet --workers "$r"; done

# A second client with the options for read-only datasets, and one with more FUSE threads.
mkdir -p "$work/mnt2"
for opts in "--read-only --attr-ttl-ms 60000" "--threads 8"; do
  # shellcheck disable=SC2086
  "$cairn" mount --meta "$meta" $opts --background --log "$work/mount2.log" "$work/mnt2"
  epochs "mount:${opts// /}" "$work/mnt2/default" imagenet --workers 4
  "$cairn" umount "$work/mnt2"
done

# Tar shards under three stripe units.
for unit in 256K 1M 4M; do
  mkdir "$work/mnt/unit-$unit"
  "$cairn" layout set "$work/mnt/unit-$unit" --ec 4+2 --unit "$unit" --meta "$meta" > /dev/null
  cp -r "$work/dataset/." "$work/mnt/unit-$unit/"
  epochs "unit=$unit" "$work/mnt/unit-$unit" wds --workers 4
done
cairn_stop

echo
echo "$(date -u +%F), $(nproc) cores, IMAGES=$images, commit $(git rev-parse --short HEAD); samples/s"
echo
echo "| setting | loader | format | epoch 1 (cold) | epoch 2 |"
echo "|---|---|---|---|---|"
awk '{ key = $1 " " $2 " " $3; v[key, $4] = $5; if (!seen[key]++) order[n++] = key }
     END { for (i = 0; i < n; i++) { split(order[i], k, " ");
           printf "| %s | %s | %s | %s | %s |\n", k[1], k[2], k[3], v[order[i], "epoch1"], v[order[i], "epoch2"] } }' "$results"
