#!/usr/bin/env bash
# bench/fio.sh DIR LABEL OUT: the data-path jobs of bench/run.sh on one mounted directory.
# Appends one line per job to OUT: "LABEL JOB MiB/s IOPS p99_read_us". The big file is written
# first and read back cold (page cache dropped), then warm (not dropped); random reads run 4
# jobs for RT seconds; small files are 128 KiB, written then read back cold.
#   SZ=1g RT=15 SMALL=2000 bench/fio.sh /mnt/cairn cairn results.txt
set -uo pipefail
dir=$1 label=$2 out=$3
sz=${SZ:-1g} rt=${RT:-15} small=${SMALL:-2000}
work=$dir/cairn-bench-fio
mkdir -p "$work" || exit 1
json=$(mktemp -d)

drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; }

job() { # name, fio args...
  local name=$1; shift
  if ! fio --name="$name" --directory="$work" --output-format=json "$@" > "$json/$name.json" 2> "$json/$name.err"; then
    echo "$label $name FAILED $(tail -1 "$json/$name.err")" | tee -a "$out"
    return
  fi
  python3 - "$label" "$name" "$json/$name.json" <<'PY' | tee -a "$out"
import json, sys
label, name, path = sys.argv[1:4]
jobs = json.load(open(path))["jobs"]
bw = sum(j["read"]["bw_bytes"] + j["write"]["bw_bytes"] for j in jobs)
iops = sum(j["read"]["iops"] + j["write"]["iops"] for j in jobs)
p99 = max((j["read"]["clat_ns"].get("percentile", {}).get("99.000000", 0) for j in jobs if j["read"]["io_bytes"]), default=0)
print(f"{label} {name} {bw / 2**20:.1f} {iops:.0f} {p99 / 1e3:.0f}")
PY
}

job seqwrite --rw=write --bs=1M --size="$sz" --numjobs=1 --end_fsync=1 --filename=big
drop
job seqread --rw=read --bs=1M --size="$sz" --numjobs=1 --filename=big
job seqread-warm --invalidate=0 --rw=read --bs=1M --size="$sz" --numjobs=1 --filename=big
drop
job randread4k --rw=randread --bs=4k --size="$sz" --runtime="$rt" --time_based --numjobs=4 --filename=big
drop
job randread128k --rw=randread --bs=128k --size="$sz" --runtime="$rt" --time_based --numjobs=4 --filename=big
job smallwrite --rw=write --bs=128k --nrfiles="$small" --filesize=128k --size=$((small * 128))k --numjobs=1 \
  --create_on_open=1 --file_service_type=sequential --filename_format='small.$filenum'
drop
job smallread --rw=read --bs=128k --nrfiles="$small" --filesize=128k --size=$((small * 128))k --numjobs=1 \
  --file_service_type=sequential --filename_format='small.$filenum'
rm -rf "$work" "$json"
