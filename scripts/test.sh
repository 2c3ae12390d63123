#!/usr/bin/env bash
# Installs what is missing (with the test models), checks formatting and lints, then runs the
# whole test suite. Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
# One target directory shared by every clone, so the C++ engines are built once per machine.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/callstream/target}"
scripts/prepare-target.sh
cargo fmt --all -- --check
# The same profile and targets as the tests (and scripts/serve.sh), so nothing is built twice.
cargo clippy --release --workspace --all-targets -- -D warnings
exec cargo test --release --workspace --all-targets "$@"
