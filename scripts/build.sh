#!/usr/bin/env bash
# Builds every target of the workspace in the release profile, in the target directory that
# scripts/test.sh uses (~/.cache/callstream/target, see scripts/build-env.sh), so the C++
# engines are compiled once per machine whichever script runs first. Prints nothing on success
# but cargo's own progress.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/build-env.sh
cargo build --release --workspace --all-targets "$@"
