#!/usr/bin/env bash
# Installs what is missing, then builds and starts the service with config.toml.
# Extra arguments go to `callstream serve` (for example --config PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# One target directory shared by every clone, so the C++ engines are built once per machine.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/callstream/target}"
exec cargo run --release --bin callstream -- serve "$@"
