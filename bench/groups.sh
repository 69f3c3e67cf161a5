#!/usr/bin/env bash
# bench/groups.sh [N]: renames within one metadata group and across two (issue 21's target: a
# rename across groups at most 3x one within a group). Starts `cairn up --meta-groups 2`
# (release build, three replicas per group as by default), gives half the namespace slots to
# group 1 and spreads new directories over both groups, makes directories under the root until
# two are group 0's and one group 1's (an inode's group is in its number: slot = ino >> 52), and
# runs bench/groups_rename.py on them with N files (default 2000). CAIRN_BIN=PATH runs another
# build.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
n=${1:-2000}
work=${WORK:-/var/tmp/cairn-groups}
[ "$(id -u)" -eq 0 ] || { echo "bench/groups.sh: run as root" >&2; exit 1; }
cd "$repo"
if [ -z "${CAIRN_BIN:-}" ]; then cargo build --release -q -p cairn; fi
source bench/lib.sh
rm -rf "$work"; mkdir -p "$work"
cairn=${CAIRN_BIN:-target/release/cairn}
cairn_start "$work/mnt" --meta-groups 2
meta=$(sed -n 's/^ready: .* from metaserver \([^ ]*\).*/\1/p' "$work/up.log")
"$cairn" meta groups move 1-2047 1 --meta "$meta"
"$cairn" meta groups spread on --meta "$meta"
groups_wait_map "$cairn" "$meta"
zero=() one=()
for i in $(seq 64); do
  d=$work/mnt/d$i
  mkdir "$d"
  if [ $(( $(stat -c %i "$d") >> 52 )) -eq 0 ]; then zero+=("$d"); else one+=("$d"); fi
  [ "${#zero[@]}" -ge 2 ] && [ "${#one[@]}" -ge 1 ] && break
done
[ "${#zero[@]}" -ge 2 ] && [ "${#one[@]}" -ge 1 ] || { echo "no directories spread over both groups" >&2; exit 1; }
echo "== $n renames each, 2 metadata groups of 3 replicas ($(nproc) cores)"
python3 bench/groups_rename.py "${zero[0]}" "${zero[1]}" "${one[0]}" "$n"
cairn_stop
rm -rf "$work"
