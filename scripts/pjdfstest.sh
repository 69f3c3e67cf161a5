#!/usr/bin/env bash
# Run the pjdfstest crate against a fresh Cairn mount and print the pass count.
# Usage: scripts/pjdfstest.sh [path/to/cairn]   (default target/debug/cairn); CAIRN_PJD_UP_ARGS
# adds arguments to `cairn up` (e.g. "--meta-groups 3": the namespace split over three groups).
# Full log: target/pjdfstest.log (CAIRN_PJD_LOG names another). Exits non-zero if the suite could
# not run at all, or, with CAIRN_PJD_STRICT=1, if any case failed; failures are always printed.
set -uo pipefail
cd "$(dirname "$0")/.."
cairn=${1:-target/debug/cairn}
command -v pjdfstest >/dev/null || cargo install --locked pjdfstest@0.2.2 || exit 1
work=$(mktemp -d /tmp/cairn-pjd.XXXXXX)
# mktemp -d makes a 0700 directory: the suite's non-root users (nobody, daemon) must be able
# to reach the mount through it, or every case that stats a path as them fails with EACCES.
# "$work/other" is on another file system: the secondary fs of the EXDEV cases.
chmod 0711 "$work"
mkdir -p "$work/mnt" "$work/other"
# A short write-back interval, so files the suite holds open also commit in the background.
"$cairn" up --data-dir "$work/data" --mount "$work/mnt" --meta-port 0 \
  --commit-interval-ms "${CAIRN_PJD_COMMIT_INTERVAL_MS:-20}" ${CAIRN_PJD_UP_ARGS:-} > "$work/up.out" 2>&1 &
up=$!
cleanup() {
  kill -TERM $up 2>/dev/null; wait $up 2>/dev/null
  mountpoint -q "$work/mnt" && umount -l "$work/mnt"
  rm -rf "$work"
}
trap cleanup EXIT
for _ in $(seq 1 600); do grep -q '^ready:' "$work/up.out" && break; kill -0 $up 2>/dev/null || break; sleep 0.1; done
if ! grep -q '^ready:' "$work/up.out"; then
  echo "pjdfstest: cairn up did not start:"; cat "$work/up.out"; exit 1
fi
grep '^ready:' "$work/up.out"
mkdir -p "$work/mnt/pjd" && chmod 0777 "$work/mnt/pjd"
log=${CAIRN_PJD_LOG:-target/pjdfstest.log}
config="$PWD/tests/pjdfstest/pjdfstest.toml"
(cd "$work/mnt/pjd" && timeout 900 pjdfstest -c "$config" -p "$work/mnt/pjd" -s "$work/other") > "$log" 2>&1
summary=$(grep '^Summary:' "$log" | tail -1)
if [ -z "$summary" ]; then
  echo "pjdfstest: no summary (see $log):"; tail -20 "$log"; exit 1
fi
echo "pjdfstest failures:"; grep -E '\s(FAILED|failed)$' "$log" | sed 's/  */ /g' | head -100
passed=$(sed -E 's/.* ([0-9]+) passed.*/\1/' <<<"$summary")
total=$(sed -E 's/.* ([0-9]+) total.*/\1/' <<<"$summary")
echo "pjdfstest on a Cairn mount: $passed of $total cases pass ($summary)"
failed=$(sed -E 's/.* ([0-9]+) failed.*/\1/' <<<"$summary")
if [ "${CAIRN_PJD_STRICT:-0}" = 1 ] && [ "$failed" != 0 ]; then
  echo "pjdfstest: $failed cases failed"; exit 1
fi
