#!/usr/bin/env bash
# Builds every target of the workspace the way scripts/test.sh does (release profile, all
# targets, one shared target directory), so the C++ engines are compiled once per machine
# whichever script runs first. Prints nothing on success but cargo's own progress.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/callstream/target}"
scripts/prepare-target.sh
cargo build --release --workspace --all-targets "$@"
scripts/prepare-target.sh --record
