#!/usr/bin/env bash
# Build the fuzz targets in fuzz/ (cargo fuzz: libFuzzer with AddressSanitizer, on the nightly
# toolchain) and run each for SECONDS (default 60), starting from its committed seeds
# (fuzz/seeds/TARGET) and the corpus earlier runs grew (target/fuzz-corpus/TARGET). A crash stops
# the run with its input in fuzz/artifacts/TARGET/; reproduce it with
# `cargo +nightly fuzz run TARGET fuzz/artifacts/TARGET/crash-…`, then make it a regression test.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
if ! rustup toolchain list | grep -q '^nightly'; then
    rustup toolchain install nightly --profile minimal
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    cargo install --locked cargo-fuzz
fi
cargo +nightly fuzz build
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cargo +nightly fuzz list)
for t in "${targets[@]}"; do
    corpus=target/fuzz-corpus/$t
    mkdir -p "$corpus"
    echo "fuzz: $t for ${secs}s"
    # -rss_limit_mb: a frame may not make the reader hold much more than the input.
    log=target/fuzz-$t.log
    if ! cargo +nightly fuzz run "$t" "$corpus" "fuzz/seeds/$t" -- \
        -max_total_time="$secs" -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1; then
        tail -n 60 "$log"
        echo "fuzz: $t FAILED (its input is in fuzz/artifacts/$t/, the whole log in $log)"
        exit 1
    fi
    grep -E '^stat::(number_of_executed_units|peak_rss_mb|new_units_added)' "$log" || true
done
echo "fuzz: ${#targets[@]} targets, ${secs}s each, no crash"
