#!/bin/bash
# Builds llama.cpp as vendored by the pinned llama-cpp-sys-2 (the source the service links, here
# built for this CPU alone) and steps.cpp against it, then runs steps.cpp: milliseconds per
# decode step at 1, 2 and 4 sequences for each model given (default: the 1.5B model of
# config.toml). Measures the engine's ceiling, not the service (docs/benchmarks.md).
#   scripts/llm-steps/run.sh [MODEL...]
# Environment: PROMPT (64), STEPS (24), ROUNDS (3), WORK (~/.cache/callstream/llm-steps).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
version="$(grep -m1 '^llama-cpp-sys-2' "$root/Cargo.toml" | sed 's/.*"=\([0-9.]*\)".*/\1/')"
src="$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/llama-cpp-sys-2-"$version"/llama.cpp | head -1)"
work="${WORK:-$HOME/.cache/callstream/llm-steps}"
if [ ! -e "$work/build/bin/libllama.so" ]; then
    rm -rf "$work" && mkdir -p "$work" && cp -r "$src/." "$work/"
    # The crate ships llama.cpp without its app directory.
    sed -i 's/^\(\s*\)add_subdirectory(app)/\1# app: not shipped/' "$work/CMakeLists.txt"
    cmake -S "$work" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_COMMON=OFF >/dev/null
    cmake --build "$work/build" -j"$(nproc)" --target llama >/dev/null
fi
g++ -O2 -std=c++17 "$here/steps.cpp" -I"$work/include" -I"$work/ggml/include" \
    -L"$work/build/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$work/build/bin" -o "$work/steps"
[ $# -gt 0 ] || set -- "$root/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
"$work/steps" "${PROMPT:-64}" "${STEPS:-24}" "${ROUNDS:-3}" "$@" 2>/dev/null
