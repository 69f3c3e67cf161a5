#!/usr/bin/env bash
# Install what the tests need, run pjdfstest against a real mount, then the whole test suite.
# The last line is the total over every test binary: "tests: N passed, N failed".
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cargo build --workspace --all-targets
scripts/pjdfstest.sh target/debug/cairn
mkdir -p target
set +e
cargo test --workspace --no-fail-fast -- --test-threads=2 2>&1 | tee target/test.log
status=${PIPESTATUS[0]}
set -e
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "tests: %d passed, %d failed\n", p, f }' target/test.log
exit "$status"
