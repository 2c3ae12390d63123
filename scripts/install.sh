#!/usr/bin/env bash
# Installs the built service under a prefix (default /usr/local): the binary in PREFIX/bin, and
# llama.cpp's shared libraries and CPU modules and oneDNN in PREFIX/lib/callstream, where the binary looks
# for them first. Run scripts/build.sh (or serve.sh, or test.sh) before. Models are not copied:
# the configuration names them (`models.*`).
set -euo pipefail
cd "$(dirname "$0")/.."
prefix="${1:-/usr/local}"
source scripts/build-env.sh
binary="$CARGO_TARGET_DIR/release/callstream"
if [ ! -x "$binary" ]; then
  echo "install: $binary is not built yet; run scripts/build.sh" >&2
  exit 1
fi
# The build's library directories are in the binary's RPATH: llama.cpp's (with the CPU modules
# in ../backends beside it) and oneDNN's.
rpath="$(readelf -d "$binary" | sed -n 's/.*(RPATH).*\[\(.*\)\]/\1/p' | tr ':' '\n')"
libdir="" dnnl=""
while read -r dir; do
  ls "$dir"/libllama.so.[0-9] > /dev/null 2>&1 && libdir="$dir"
  [ -f "$dir/libdnnl.so.3" ] && dnnl="$dir"
done <<< "$rpath"
modules="$(dirname "${libdir:-/nonexistent}")/backends"
if [ -z "$libdir" ] || ! ls "$modules"/libggml-cpu-*.so > /dev/null 2>&1; then
  echo "install: llama.cpp's libraries are not where $binary was linked against" >&2
  exit 1
fi
if [ -z "$dnnl" ]; then
  echo "install: oneDNN (libdnnl.so.3) is not where $binary was linked against" >&2
  exit 1
fi
install -d "$prefix/bin" "$prefix/lib/callstream"
# lib*.so.N are links to the versioned files: install copies what they point to, by that name.
install -m 644 "$libdir"/lib*.so.[0-9] "$modules"/libggml-cpu-*.so "$dnnl/libdnnl.so.3" "$prefix/lib/callstream/"
install -m 755 "$binary" "$prefix/bin/callstream"
echo "installed $prefix/bin/callstream and $(ls "$prefix/lib/callstream" | wc -l) libraries in $prefix/lib/callstream"
