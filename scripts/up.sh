#!/usr/bin/env bash
# Build Cairn and run a whole local cluster (1 metaserver + 6 chunkservers, EC 4+2), mounted.
#   CAIRN_DATA (default /var/tmp/cairn)  CAIRN_MOUNT (default /mnt/cairn); extra args go to `cairn up`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cargo build --release --bin cairn
exec target/release/cairn up --data-dir "${CAIRN_DATA:-/var/tmp/cairn}" --mount "${CAIRN_MOUNT:-/mnt/cairn}" "$@"
