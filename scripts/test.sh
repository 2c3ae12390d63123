#!/usr/bin/env bash
# Installs what is missing (with the test models), then runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
# One target directory shared by every clone, so the C++ engines are built once per machine.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/callstream/target}"
exec cargo test --release --workspace --all-targets "$@"
