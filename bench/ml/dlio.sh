#!/usr/bin/env bash
# bench/ml/dlio.sh: MLPerf Storage's training benchmark, DLIO (PyPI dlio-benchmark: emulated
# accelerators that sleep for each batch's compute time while the framework's real data loader
# reads the next batches), on local ext4, a Cairn mount (`cairn up`) and the installed peers, in
# one run; tables of accelerator utilisation (AU) per epoch, samples/s and MiB/s with ratios
# (bench/ml/dlio_table.py). Run as root (page-cache drops, FUSE, peers).
#
#   bench/ml/dlio.sh
#   PEERS="moosefs juicefs gluster" bench/ml/dlio.sh
#   WORKLOADS=unet3d_h100 FILES=40 ACCELERATORS="1 2 4" EPOCHS=3 READ_THREADS=4 bench/ml/dlio.sh
#   CAIRN_BIN=/tmp/cairn WORKLOADS=resnet50_h100 FILES=2 ACCELERATORS=1 bench/ml/dlio.sh  # a prebuilt cairn
#
# WORKLOADS are DLIO's own configs/workload/*.yaml (unet3d_h100: PyTorch reading ~140 MB .npz
# volumes, batch 7, 0.323 s compute per batch; resnet50_h100: tf.data reading TFRecord files of
# 1251 ~112 KB images, batch 400, 0.224 s), run as they are but for FILES training files (default
# 56 for unet3d, 16 for resnet50, about 8 and 2.3 GB), READ_THREADS reader processes or threads per
# accelerator (default 2), EPOCHS (default 2) and checkpointing off. DLIO generates each dataset
# once on ext4 ($WORK/ext4, read there in place); each other filesystem gets it by `cp -r` (timed,
# page cache dropped first). Then for each N in ACCELERATORS (default "1 2") the page cache is
# dropped and DLIO trains with N emulated accelerators, one MPI process each (`mpiexec -n N`),
# which share the files: epoch 1 is cold, later epochs read what the page cache kept. AU is the
# share of the time after the first batch that the accelerators spent computing. A run needs 2
# batches per accelerator or more (FILES x samples per file >= 2 x batch x N); each table row
# says how many it had. DLIO's output goes to $WORK/out, off the filesystem under test; a
# filesystem's copy and its backing store are removed after its turn. Default run: about 6
# minutes here (2 cores; the first run also installs the venv, about 2), 3 to 5 more per peer.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
work=${WORK:-/var/tmp/cairn-dlio}
venv=${VENV:-$repo/target/ml-venv}
peers=${PEERS:-}
workloads=${WORKLOADS:-unet3d_h100 resnet50_h100}
accelerators=${ACCELERATORS:-1 2}
epochs=${EPOCHS:-2}
read_threads=${READ_THREADS:-2}
[ "$(id -u)" -eq 0 ] || { echo "bench/ml/dlio.sh: run as root (drops the page cache, mounts FUSE)" >&2; exit 1; }
if mountpoint -q "$work/mnt"; then echo "bench/ml/dlio.sh: $work/mnt is still mounted" >&2; exit 1; fi
start=$(date +%s)

cd "$repo"
# DLIO and what it imports, pinned, into the venv of bench/ml/run.sh (which brings PyTorch,
# TensorFlow and NumPy, pinned in venv.sh; DLIO imports TensorFlow whatever the workload).
# --no-deps: dlio-benchmark also asks for nvidia-dali-cuda110, torchvision, torchaudio, h5py and
# full tensorflow, none of which these workloads import. MPICH comes as a PyPI wheel (mpiexec
# and libmpi in the venv, for mpi4py's wheel); pydftracer brings the `dftracer` module DLIO
# needs even with tracing off (DFTRACER_ENABLE=0 below; DLIO's stand-in for it is broken).
bench/ml/venv.sh "$venv" all
dlio_packages="dlio-benchmark==2.0.0 hydra-core==1.3.8 omegaconf==2.3.1 antlr4-python3-runtime==4.9.3
  PyYAML==6.0.4 pandas==3.1.1 python-dateutil==4.0.0 tzdata==2026.6 psutil==7.2.2 mpi4py==4.1.2
  mpich==5.0.2 pydftracer==1.0.2"
if [ "$(cat "$venv/cairn-dlio-packages" 2>/dev/null)" != "$dlio_packages" ]; then
  # shellcheck disable=SC2086
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps $dlio_packages
  printf '%s\n' "$dlio_packages" > "$venv/cairn-dlio-packages"
fi
python=$venv/bin/python
. bench/lib.sh
# CAIRN_BIN: a build made elsewhere (bench/lib.sh starts it).
[ -n "${CAIRN_BIN:-}" ] || cargo build --release -q -p cairn
# DLIO's TFRecord generator runs DALI's tfrecord2idx; bench/ml/dlio/ has a stand-in.
export PATH=$repo/bench/ml/dlio:$PATH DFTRACER_ENABLE=0 TF_CPP_MIN_LOG_LEVEL=3

rm -rf "$work"
mkdir -p "$work/ext4" "$work/mnt" "$work/out"
results=$work/results.txt
: > "$results"

files_of() { # workload
  case $1 in
    unet3d*) echo "${FILES:-56}" ;;
    resnet50*) echo "${FILES:-16}" ;;
    *) echo "${FILES:-16}" ;;
  esac
}

dlio() { # output-folder workload dataset accelerators [hydra overrides...]: one DLIO run, quiet
  local out=$1 w=$2 data=$3 n=$4
  shift 4
  mkdir -p "$out"
  (cd "$out" && "$venv/bin/mpiexec" -n "$n" "$venv/bin/dlio_benchmark" "workload=$w" "hydra.run.dir=$out" \
    "++workload.output.folder=$out" "++workload.checkpoint.checkpoint_folder=$out/checkpoints" \
    "++workload.dataset.data_folder=$data" "++workload.dataset.num_files_train=$(files_of "$w")" \
    "$@" > "$out/run.log" 2>&1) || { echo "DLIO failed: $out/run.log" >&2; tail -5 "$out/run.log" >&2; return 1; }
}

# The datasets, once, on ext4 (one generator process per core).
for w in $workloads; do
  echo "== generate $w: $(files_of "$w") files"
  dlio "$work/out/generate/$w" "$w" "$work/ext4/$w" "$(nproc)" \
    ++workload.workflow.generate_data=True ++workload.workflow.train=False ++workload.workflow.checkpoint=False
  echo "   $(du -sh "$work/ext4/$w/train" | cut -f1)"
done
# Each filesystem holds one dataset at a time: MooseFS 2 copies of it, Cairn 1.5 (4+2).
need=$(for w in $workloads; do du -sm "$work/ext4/$w" | cut -f1; done | sort -n | tail -1)
if [ "$(df -m --output=avail "$work" | tail -1)" -lt $((need * 2)) ]; then
  echo "warning: under $((need * 2)) MiB free in $work: a copy may not fit"
fi

listing() { # dir: every file's path and size
  find "$1" -type f -printf '%P %s\n' | sort
}

stage() { # dir label workload: `cp -r` of ext4's dataset, timed, checked by name and size
  local dir=$1 label=$2 w=$3 mib t0 t1
  drop_caches
  mib=$(du -sm "$work/ext4/$w" | cut -f1)
  t0=$(date +%s.%N)
  if ! cp -r "$work/ext4/$w" "$dir/" || ! sync; then echo "   $w: copy failed; left out"; return 1; fi
  t1=$(date +%s.%N)
  if [ "$(listing "$dir/$w")" != "$(listing "$work/ext4/$w")" ]; then
    echo "   $w: the copy's files differ in name or size from ext4's; left out"
    return 1
  fi
  python3 -c "print('$label $w stage %.1f' % ($mib / ($t1 - $t0)))" >> "$results"
  echo "   $w: cp -r $(tail -1 "$results" | cut -d' ' -f4) MiB/s"
}

train() { # dir label workload: DLIO's training on dir/workload, for each accelerator count
  local dir=$1 label=$2 w=$3 n out
  for n in $accelerators; do
    out=$work/out/$label/$w-$n
    drop_caches
    dlio "$out" "$w" "$dir/$w" "$n" ++workload.workflow.generate_data=False ++workload.workflow.train=True \
      ++workload.workflow.checkpoint=False "++workload.train.epochs=$epochs" \
      "++workload.reader.read_threads=$read_threads" || continue
    "$python" bench/ml/dlio_table.py add "$results" "$label" "$w" "$out" "$work/ext4/$w"
    grep "^$label $w $n " "$results" |
      awk '{printf "   %s x%s %s, %s step%s each: AU %s%%, %s samples/s, %s MiB/s\n", $2, $3, $4, $5, $5 == 1 ? "" : "s", $6, $7, $8}'
  done
}

run_on() { # dir label: every workload; ext4 reads the datasets in place, the others a copy
  local dir=$1 label=$2 w
  echo "== $label ($dir)"
  # MooseFS keeps deleted files a day in its trash: the copies removed below would stay on disk.
  if [ "$label" = moosefs ]; then mfssettrashtime -r 0 "$dir" > /dev/null || true; fi
  for w in $workloads; do
    if [ "$dir" = "$work/ext4" ]; then train "$dir" "$label" "$w"; continue; fi
    if stage "$dir" "$label" "$w"; then train "$dir" "$label" "$w"; fi
    rm -rf "${dir:?}/$w"
  done
}

# Local ext4 (where the datasets were made), Cairn (`cairn up`: 4+2, 1 MiB units), the peers;
# each cluster and its backing store are removed after its turn (they hold a copy of everything).
run_on "$work/ext4" ext4
rm -rf "$work/cairn"
cairn_start "$work/mnt"
run_on "$work/mnt" cairn
cairn_stop
rm -rf "$work/cairn"
for peer in $peers; do
  peer_start "$peer" || continue
  trap 'peer_stop "$peer"' EXIT
  run_on "$peer_mnt" "$peer"
  peer_stop "$peer"
  trap - EXIT
  rm -rf "$(dirname "$peer_mnt")"
done

rm -rf "$work/ext4"  # the datasets; $WORK keeps results.txt and DLIO's output

echo
echo "$(date -u +%F), $(nproc) cores, DLIO 2.0.0, training files:$(for w in $workloads; do printf ' %s %s' "$w" "$(files_of "$w")"; done)," \
  "ACCELERATORS=\"$accelerators\" EPOCHS=$epochs READ_THREADS=$read_threads, $(( $(date +%s) - start )) s," \
  "commit $(git rev-parse --short HEAD)"
"$python" bench/ml/dlio_table.py "$results"
