#!/usr/bin/env bash
# Installs what is missing, then builds and starts the service with config.toml.
# Extra arguments go to `callstream serve` (for example --config PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
exec scripts/callstream serve "$@"
