#!/usr/bin/env bash
# Install the system packages Cairn builds and tests with (Debian 12), if any is missing.
set -euo pipefail
pkgs=(fuse3 libfuse3-dev librocksdb-dev libclang-dev clang protobuf-compiler pkg-config fio python3 tar diffutils git sqlite3 python3-venv e2fsprogs curl)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -q
  $sudo apt-get install -y -q "${missing[@]}"
fi
command -v cargo >/dev/null || { echo "cargo not found: install Rust (rustup) first" >&2; exit 1; }
