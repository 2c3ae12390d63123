#!/usr/bin/env bash
# Installs what is missing (with the test models), checks formatting, builds every target of the
# workspace with clippy's lints as errors, then runs the whole test suite. Extra arguments go to
# `cargo test`. Prints how long each step took.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
step() {
    local name=$1 t=$SECONDS
    shift
    "$@"
    echo "test.sh: $name took $((SECONDS - t)) s" >&2
}
step setup scripts/setup.sh --test
# One target directory shared by every clone, so the C++ engines are built once per machine.
source scripts/build-env.sh
step fmt cargo fmt --all -- --check
# Clippy lints while compiling, not in a check pass of its own: the workspace's crates go through
# clippy-driver (what `cargo clippy` runs) in the release build itself, with the arguments
# `cargo clippy -- -D warnings` would give it. The dependencies are compiled once, by rustc, and
# a lint fails the build exactly as it fails `cargo clippy --release --all-targets -- -D warnings`.
export RUSTC_WORKSPACE_WRAPPER
RUSTC_WORKSPACE_WRAPPER="$(command -v clippy-driver || echo "$(rustc --print sysroot)/bin/clippy-driver")"
export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
step build cargo test --release --workspace --all-targets --no-run
# The pure parts of the engine (protocol, audio path, call actors, billing) build and pass their
# tests without CTranslate2 or llama.cpp: the actors crate without its `whisper` feature.
step pure cargo test --release -p callstream-actors --no-default-features
step tests cargo test --release --workspace --all-targets "$@"
echo "test.sh: all steps took $((SECONDS - started)) s" >&2
