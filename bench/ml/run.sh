#!/usr/bin/env bash
# bench/ml/run.sh: real PyTorch DataLoader and tf.data pipelines reading the same generated
# training dataset (bench/ml/gen.py: ImageNet-like JPEG files, WebDataset tar shards, TFRecords,
# unet3d-like .npz volumes) from local ext4, a Cairn mount (`cairn up`) and the installed peers,
# in one run; one table with ratios (bench/ml/table.py). Run as root (page-cache drops, FUSE).
#
#   bench/ml/run.sh
#   PEERS="moosefs juicefs gluster" IMAGES=4000 bench/ml/run.sh
#   FRAMEWORKS=torch FORMATS="imagenet wds" WORKERS=4 COMPUTE_MS=25 bench/ml/run.sh
#
# Per filesystem: the dataset is staged with `cp -r` (timed), then every framework x format reads
# it for two epochs: epoch 1 after dropping the page cache (cold), epoch 2 straight after (warm).
# On Cairn a third pass follows `cairn warmup` (shards pulled into the SSD tier) and a page-cache
# drop. Then the emulated-accelerator pass: PyTorch, JPEG files, cold, sleeping COMPUTE_MS per
# batch of 64 (25 ms: an accelerator that trains ~2,560 images/s), reporting utilisation.
# Every sample of every epoch is checked against the generator's SHA-256 manifest.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
work=${WORK:-/var/tmp/cairn-ml}
venv=${VENV:-$repo/target/ml-venv}
peers=${PEERS:-}
images=${IMAGES:-4000}
npz=${NPZ:-32}
frameworks=${FRAMEWORKS:-torch tf}
formats=${FORMATS:-imagenet wds tfrecord npz}
workers=${WORKERS:-4}
compute_ms=${COMPUTE_MS:-25}
[ "$(id -u)" -eq 0 ] || { echo "bench/ml/run.sh: run as root (drops the page cache, mounts FUSE)" >&2; exit 1; }

cd "$repo"
case " $frameworks " in *" tf "*) bench/ml/venv.sh "$venv" all ;; *) bench/ml/venv.sh "$venv" torch ;; esac
python=$venv/bin/python
cargo build --release -q -p cairn
. bench/lib.sh

rm -rf "$work"
mkdir -p "$work/ext4" "$work/mnt"
results=$work/results.txt
: > "$results"
"$python" bench/ml/gen.py "$work/dataset" --images "$images" --npz "$npz"
dataset_mib=$(du -sm "$work/dataset" | cut -f1)

load() { # framework dir label [loader flags...]
  local fw=$1 dir=$2 label=$3 fmt
  shift 3
  for fmt in $formats; do
    "$python" "bench/ml/${fw}_loader.py" "$dir" --format "$fmt" --workers "$workers" --label "$label" \
      --results "$results" "$@" 2> >(quiet_tf >&2)
  done
}

run_on() { # dir label
  local dir=$1/dataset label=$2 start end fw
  echo "== $label ($1)"
  drop_caches
  start=$(date +%s.%N)
  cp -r "$work/dataset" "$dir"
  sync
  end=$(date +%s.%N)
  python3 -c "print('$label stage cp-r %.1f' % ($dataset_mib / ($end - $start)))" | tee -a "$results"
  for fw in $frameworks; do
    load "$fw" "$dir" "$label" --epochs 2 --drop-caches
    if [ "$label" = cairn ]; then
      "$repo/target/release/cairn" warmup "$dir" --json > "$work/warmup-$fw.json"
      load "$fw" "$dir" "$label" --epochs 1 --drop-caches --epoch-name warmup
    fi
  done
  (formats=imagenet; load torch "$dir" "$label" --epochs 1 --drop-caches --epoch-name accel --compute-ms "$compute_ms")
}

# Peers start empty (peer_start clears their directories).
on_every_system run_on

echo
echo "$(date -u +%F), $(nproc) cores, IMAGES=$images NPZ=$npz WORKERS=$workers COMPUTE_MS=$compute_ms," \
  "dataset $dataset_mib MiB, commit $(git rev-parse --short HEAD)"
"$python" bench/ml/table.py "$results"
