# Sourced by the scripts that build or run the build (build.sh, test.sh, install.sh, callstream).
#
# Exports CARGO_TARGET_DIR: the one target directory every clone on this machine shares, so the
# C++ engines are compiled once per machine, and creates it.
#
# Exports CMAKE_PROJECT_INCLUDE (llama.cpp's CMake include, see .cargo/config.toml) as a copy of
# scripts/cmake kept in the target directory. llama.cpp's CMake records the include's path when it
# first configures a directory and never again; a path inside a clone would leave every later
# clone building with the first one's include, or failing once that clone is deleted. The copy
# has one path for the life of the target directory, and is brought up to date here, so CMake
# sees a changed include when it next checks its build system.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/callstream/target}"
mkdir -p "$CARGO_TARGET_DIR/callstream-cmake"
callstream_cmake_from="$(dirname "${BASH_SOURCE[0]}")/cmake"
for callstream_file in "$CARGO_TARGET_DIR/callstream-cmake"/*; do
    [ -e "$callstream_file" ] || continue
    [ -e "$callstream_cmake_from/$(basename "$callstream_file")" ] || rm -f "$callstream_file"
done
for callstream_file in "$callstream_cmake_from"/*; do
    # Copied only when changed, so an unchanged include does not make CMake configure again.
    cmp -s "$callstream_file" "$CARGO_TARGET_DIR/callstream-cmake/$(basename "$callstream_file")" ||
        cp "$callstream_file" "$CARGO_TARGET_DIR/callstream-cmake/"
done
unset callstream_cmake_from callstream_file
export CMAKE_PROJECT_INCLUDE="$CARGO_TARGET_DIR/callstream-cmake/llama-cpp.cmake"
# A llama.cpp build directory configured before this arrangement (or from a clone's own
# scripts/cmake) keeps that first path in its CMakeCache.txt, and fails once that clone is gone.
# The entry is pointed at the copy; CMake configures again the next time it builds there.
for callstream_cache in "$CARGO_TARGET_DIR"/*/build/llama-cpp-sys-2-*/out/build/CMakeCache.txt; do
    [ -f "$callstream_cache" ] || continue
    # Rewritten only when it differs: a touched cache makes CMake configure again.
    [ "$(sed -n 's/^CMAKE_PROJECT_INCLUDE:[A-Z]*=//p' "$callstream_cache")" = "$CMAKE_PROJECT_INCLUDE" ] ||
        sed -i "s|^CMAKE_PROJECT_INCLUDE:\([A-Z]*\)=.*|CMAKE_PROJECT_INCLUDE:\1=$CMAKE_PROJECT_INCLUDE|" "$callstream_cache"
done
unset callstream_cache

# llama-cpp-sys-2 (0.1.161) hard-links llama.cpp's `lib*.so` names into the target directory, and
# those names are symlinks to versioned files it does not link, so they point nowhere there. When
# its build script runs again (a changed GGML_* variable, such as GGML_CALLSTREAM_INCLUDE), it
# takes them for absent, links again and fails with "File exists" (reported upstream:
# utilityai/llama-cpp-rs issue 896). They are removed here: pointing nowhere, nothing uses them.
for callstream_dir in "$CARGO_TARGET_DIR"/*/ "$CARGO_TARGET_DIR"/*/examples/ "$CARGO_TARGET_DIR"/*/deps/; do
    [ -d "$callstream_dir" ] || continue
    find "$callstream_dir" -maxdepth 1 -xtype l -name 'lib*.so*' -delete
done
unset callstream_dir
