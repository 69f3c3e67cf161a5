#!/usr/bin/env bash
# Install what the tests need, run the whole test suite, then pjdfstest against a real mount.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cargo build --workspace --all-targets
scripts/pjdfstest.sh target/debug/cairn
cargo test --workspace -- --test-threads=2
