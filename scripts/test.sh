#!/usr/bin/env bash
# Install what the tests need (Debian packages; PyTorch into target/ml-venv), run pjdfstest
# against a real mount (one metadata group, then three), validate deploy/ against the Kubernetes, Compose and Dockerfile schemas,
# run every fuzz target for a minute (scripts/fuzz.sh), then the whole test suite (every test
# binary, even after one fails). The last line is the total over every test binary:
# "tests: N passed, N failed".
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
bench/ml/venv.sh target/ml-venv torch  # PyTorch for tests/training.rs (about a minute)
cargo build --workspace --all-targets
scripts/pjdfstest.sh target/debug/cairn
mkdir -p target
set +e
# And over three metadata groups (the namespace split, directories spread over them): every
# case that passes over one group must pass here too.
CAIRN_PJD_UP_ARGS="--meta-groups 3" CAIRN_PJD_STRICT=1 CAIRN_PJD_LOG=target/pjdfstest-groups.log \
  scripts/pjdfstest.sh target/debug/cairn
groups_status=$?
scripts/validate-deploy.sh
deploy_status=$?
# Every fuzz target for a minute (cargo fuzz; installs the nightly toolchain and cargo-fuzz if
# missing): hostile frames, shard files and configs must not crash anything.
scripts/fuzz.sh 60
fuzz_status=$?
cargo test --workspace --no-fail-fast -- --test-threads=2 2>&1 | tee target/test.log
status=${PIPESTATUS[0]}
set -e
[ "$deploy_status" -eq 0 ] || echo "scripts/validate-deploy.sh failed (exit $deploy_status)"
[ "$fuzz_status" -eq 0 ] || echo "scripts/fuzz.sh failed (exit $fuzz_status)"
[ "$groups_status" -eq 0 ] || echo "pjdfstest over three metadata groups failed (exit $groups_status)"
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "tests: %d passed, %d failed\n", p, f }' target/test.log
[ "$status" -ne 0 ] || status=$deploy_status
[ "$status" -ne 0 ] || status=$fuzz_status
[ "$status" -ne 0 ] || status=$groups_status
exit "$status"
