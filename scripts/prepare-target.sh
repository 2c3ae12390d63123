#!/usr/bin/env bash
# Readies a shared target directory that an older checkout built, before cargo runs:
# - llama.cpp's CMake is configured only once per build directory (llama-cpp-sys-2 skips the
#   step when CMakeCache.txt exists), so a cache configured without scripts/cmake/llama-cpp.cmake
#   (or with one from a clone since deleted) is removed and the next build configures again;
# - llama-cpp-sys-2's build script hard-links llama.cpp's libraries into the target directory,
#   symlinks included, which leaves links that point nowhere; when the script runs a second
#   time it takes them for absent, links again and fails with "File exists". They are removed.
# Prints what it changes; nothing on a fresh or current directory.
set -euo pipefail
target="${CARGO_TARGET_DIR:?CARGO_TARGET_DIR is not set}"
[ -d "$target" ] || exit 0
for cache in "$target"/*/build/llama-cpp-sys-2-*/out/build/CMakeCache.txt; do
    [ -f "$cache" ] || continue
    include="$(sed -n 's/^CMAKE_PROJECT_INCLUDE:[A-Z]*=//p' "$cache")"
    # Configured without the include, or with one from a clone that is gone (CMake reads it
    # again whenever it checks its build system).
    if [[ "$include" != */scripts/cmake/llama-cpp.cmake || ! -f "$include" ]]; then
        echo "prepare-target: llama.cpp will be configured again: $(dirname "$cache")"
        rm -f "$cache"
    fi
done
for dir in "$target"/*/ "$target"/*/examples/ "$target"/*/deps/; do
    [ -d "$dir" ] || continue
    find "$dir" -maxdepth 1 -xtype l -name 'lib*.so*' -print -delete |
        sed 's/^/prepare-target: removed a dangling link: /'
done
