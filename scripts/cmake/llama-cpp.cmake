# Included by llama.cpp's CMake at each project() call (CMAKE_PROJECT_INCLUDE, set in
# .cargo/config.toml and passed on by llama-cpp-sys-2's build script).
#
# The AMX matrix product (ggml-cpu/amx/mmq.cpp, built only into the sapphirerapids CPU module)
# fills a tile configuration on the stack and hands it to _tile_loadconfig. GCC's intrinsic
# declares that it reads only the first 8 bytes, so GCC (12 here) drops the stores of the
# rows and column widths as dead: ldtilecfg loads a palette with every tile unconfigured and the
# first tilezero raises an illegal instruction. Dead-store elimination is turned off for that one
# file of that one module; every other file is compiled as llama.cpp sets it.
#
# The same module also gets amx-attention.cpp (beside this file): attention's f16 matrix
# products on AMX bf16 tiles. The module is linked with --wrap=llamafile_sgemm, so llama.cpp's
# calls to its matrix kernel go through that file first, which passes on what it does not take.
#
# Every x86 CPU module gets softmax.cpp (beside this file), linked with
# --wrap=ggml_compute_forward_soft_max: llama.cpp's softmax with the row maximum found many lanes
# at a time instead of one after another, bit for bit the same rows.
#
# No file of llama.cpp is edited. scripts/prepare-target.sh makes llama.cpp build again when a
# file here changes.

get_property(callstream_amx_fix_deferred GLOBAL PROPERTY CALLSTREAM_AMX_FIX_DEFERRED)
if (NOT callstream_amx_fix_deferred AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    set_property(GLOBAL PROPERTY CALLSTREAM_AMX_FIX_DEFERRED TRUE)
    set_property(GLOBAL PROPERTY CALLSTREAM_CMAKE_DIR "${CMAKE_CURRENT_LIST_DIR}")

    function(callstream_cpu_modules)
        get_property(callstream_dir GLOBAL PROPERTY CALLSTREAM_CMAKE_DIR)
        set(softmax "${callstream_dir}/softmax.cpp")
        foreach(variant x64 sse42 sandybridge ivybridge piledriver haswell skylakex cannonlake
                cascadelake icelake cooperlake zen4 alderlake sapphirerapids)
            set(module ggml-cpu-${variant})
            if (NOT TARGET ${module})
                continue()
            endif()
            target_sources(${module} PRIVATE "${softmax}")
            set_source_files_properties("${softmax}" TARGET_DIRECTORY ${module}
                PROPERTIES COMPILE_OPTIONS "-ffp-contract=off")
            set_property(TARGET ${module} APPEND PROPERTY
                LINK_OPTIONS "-Wl,--wrap=ggml_compute_forward_soft_max")
            message(STATUS "callstream: ${module} takes the softmax's maximum lane-wise")
        endforeach()
        callstream_sapphirerapids_module()
    endfunction()

    function(callstream_sapphirerapids_module)
        if (NOT TARGET ggml-cpu-sapphirerapids)
            return()
        endif()
        get_target_property(module_dir ggml-cpu-sapphirerapids SOURCE_DIR)
        set_source_files_properties("${module_dir}/ggml-cpu/amx/mmq.cpp"
            TARGET_DIRECTORY ggml-cpu-sapphirerapids
            PROPERTIES COMPILE_OPTIONS "-fno-tree-dse;-fno-dse")
        message(STATUS "callstream: ggml-cpu-sapphirerapids amx/mmq.cpp built without dead-store elimination")

        get_property(callstream_dir GLOBAL PROPERTY CALLSTREAM_CMAKE_DIR)
        set(attention "${callstream_dir}/amx-attention.cpp")
        target_sources(ggml-cpu-sapphirerapids PRIVATE "${attention}")
        set_source_files_properties("${attention}"
            TARGET_DIRECTORY ggml-cpu-sapphirerapids
            PROPERTIES COMPILE_OPTIONS "-mamx-bf16;-fno-tree-dse;-fno-dse")
        set_property(TARGET ggml-cpu-sapphirerapids APPEND PROPERTY
            LINK_OPTIONS "-Wl,--wrap=llamafile_sgemm")
        message(STATUS "callstream: ggml-cpu-sapphirerapids computes attention on AMX bf16 tiles")
    endfunction()

    # Runs when the top-level CMakeLists.txt has been read, so every target exists.
    cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL callstream_cpu_modules)
endif()
