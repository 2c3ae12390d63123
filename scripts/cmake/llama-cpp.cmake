# Included by llama.cpp's CMake at each project() call (CMAKE_PROJECT_INCLUDE, set in
# .cargo/config.toml and passed on by llama-cpp-sys-2's build script). llama.cpp itself is built
# as published; this file only keeps it from crashing on AMX CPUs when built with GCC.
#
# The AMX matrix product (ggml-cpu/amx/mmq.cpp, built only into the sapphirerapids CPU module)
# fills a tile configuration on the stack and hands it to _tile_loadconfig. GCC's intrinsic
# declares that it reads only the first 8 bytes, so GCC (12 here) drops the stores of the rows
# and column widths as dead: ldtilecfg loads a palette with every tile unconfigured and the
# first tilezero raises an illegal instruction (SIGILL). Dead-store elimination is turned off for
# that one file of that one module.
#
# Upstream: reported in ggml-org/llama.cpp pull request 26954 (open when this was written),
# which moves the tile configuration off the stack for the same reason. Drop this file when the
# pinned llama.cpp (Cargo.toml) has that change.
#
# When this file changes, change GGML_CALLSTREAM_INCLUDE in .cargo/config.toml to its new
# digest (tests/build_config.rs checks that they agree): llama-cpp-sys-2's build script runs
# again when a GGML_* variable changes, and CMake then configures and builds llama.cpp again.

get_property(callstream_amx_fix_deferred GLOBAL PROPERTY CALLSTREAM_AMX_FIX_DEFERRED)
if (NOT callstream_amx_fix_deferred AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    set_property(GLOBAL PROPERTY CALLSTREAM_AMX_FIX_DEFERRED TRUE)

    function(callstream_sapphirerapids_module)
        if (NOT TARGET ggml-cpu-sapphirerapids)
            return()
        endif()
        get_target_property(module_dir ggml-cpu-sapphirerapids SOURCE_DIR)
        set_source_files_properties("${module_dir}/ggml-cpu/amx/mmq.cpp"
            TARGET_DIRECTORY ggml-cpu-sapphirerapids
            PROPERTIES COMPILE_OPTIONS "-fno-tree-dse;-fno-dse")
        message(STATUS "callstream: ggml-cpu-sapphirerapids amx/mmq.cpp built without dead-store elimination")
    endfunction()

    # Runs when the top-level CMakeLists.txt has been read, so every target exists.
    cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL callstream_sapphirerapids_module)
endif()
