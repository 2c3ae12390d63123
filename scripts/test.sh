#!/usr/bin/env bash
# Installs what is missing (with the test models), checks formatting and lints, then runs the
# whole test suite. Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
# One target directory shared by every clone, so the C++ engines are built once per machine.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/callstream/target}"
scripts/prepare-target.sh
# The AMX attention kernel of llama.cpp's sapphirerapids module (scripts/cmake/amx-attention.cpp)
# against a plain reference, on a CPU that can run it.
if grep -qw amx_bf16 /proc/cpuinfo; then
    g++ -O2 -std=c++17 -march=sapphirerapids -DCALLSTREAM_AMX_STANDALONE \
        scripts/cmake/amx-attention-check.cpp -o "$CARGO_TARGET_DIR/amx-attention-check" -lpthread
    "$CARGO_TARGET_DIR/amx-attention-check"
fi
# llama.cpp's softmax with its maximum taken lane-wise (scripts/cmake/softmax.cpp), bit for bit
# against the steps of llama.cpp's own, on every x86 CPU.
if [[ "$(uname -m)" == x86_64 ]]; then
    g++ -O2 -std=c++17 -march=native -ffp-contract=off -DCALLSTREAM_SOFTMAX_STANDALONE \
        scripts/cmake/softmax-check.cpp -o "$CARGO_TARGET_DIR/softmax-check"
    "$CARGO_TARGET_DIR/softmax-check"
fi
cargo fmt --all -- --check
# The same profile and targets as the tests (and scripts/serve.sh), so nothing is built twice.
cargo clippy --release --workspace --all-targets -- -D warnings
scripts/prepare-target.sh --record
exec cargo test --release --workspace --all-targets "$@"
