#!/usr/bin/env bash
# Builds every target of the workspace in the release profile, in the target directory that
# scripts/test.sh uses (~/.cache/callstream/target), so the C++ engines are compiled once per
# machine whichever script runs first. Prints nothing on success but cargo's own progress.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/callstream/target}"
mkdir -p "$CARGO_TARGET_DIR"
cargo build --release --workspace --all-targets "$@"
