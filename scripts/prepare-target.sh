#!/usr/bin/env bash
# Readies a shared target directory that an older checkout built, before cargo runs:
# - llama.cpp's CMake is configured only once per build directory (llama-cpp-sys-2 skips the
#   step when CMakeCache.txt exists), so a cache configured without scripts/cmake/llama-cpp.cmake
#   (or with one from a clone since deleted) is removed and the next build configures again;
# - when the files under scripts/cmake/ are not those llama.cpp was last built with here (a
#   stamp beside its build records their digest; `--record`, run after a build, writes it),
#   cargo is made to run llama-cpp-sys-2's build script again (its fingerprint is removed),
#   which builds llama.cpp again: CMake itself notices the changed include, make the changed
#   sources;
# - llama-cpp-sys-2's build script hard-links llama.cpp's libraries into the target directory,
#   symlinks included, which leaves links that point nowhere; when the script runs a second
#   time it takes them for absent, links again and fails with "File exists". They are removed.
# Prints what it changes; nothing on a fresh or current directory.
set -euo pipefail
target="${CARGO_TARGET_DIR:?CARGO_TARGET_DIR is not set}"
record=0
[[ "${1:-}" == "--record" ]] && record=1
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
digest="$(cat "$(dirname "$0")"/cmake/* | sha256sum | cut -d' ' -f1)"
for out in "$target"/*/build/llama-cpp-sys-2-*/out; do
    [ -f "$out/build/CMakeCache.txt" ] || continue
    unit="$(basename "$(dirname "$out")")"
    fingerprint="$(dirname "$(dirname "$(dirname "$out")")")/.fingerprint/$unit"
    stamp="$out/callstream-cmake.sha256"
    if [[ "$record" == 1 ]]; then
        # After a build: the units it ran (their fingerprints are back) are current.
        [ -d "$fingerprint" ] && echo "$digest" > "$stamp"
    elif [[ "$(cat "$stamp" 2>/dev/null)" != "$digest" && -d "$fingerprint" ]]; then
        echo "prepare-target: llama.cpp will be built again (scripts/cmake changed): $unit"
        rm -rf "$fingerprint"
    fi
done
[[ "$record" == 1 ]] && exit 0
for dir in "$target"/*/ "$target"/*/examples/ "$target"/*/deps/; do
    [ -d "$dir" ] || continue
    find "$dir" -maxdepth 1 -xtype l -name 'lib*.so*' -print -delete |
        sed 's/^/prepare-target: removed a dangling link: /'
done
