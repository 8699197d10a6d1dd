# Records the peak memory of every compile (cpp/cmake/compile_memory.py as the
# outermost compiler launcher, in front of ccache) into
# <build dir>/compile_memory.tsv, from which ci/compile_jobs.py sizes the next
# build's parallel jobs. CuTe translation units differ by ~3x in what they
# need (softmax ~1 GB, attention backward and sm90 GEMM ~3.7 GB), so a
# constant per job either wastes cores or runs out of memory.
if(NOT Python_EXECUTABLE)
  find_package(Python COMPONENTS Interpreter)
endif()
if(Python_EXECUTABLE)
  set(_samattn_memory_launcher "${Python_EXECUTABLE}"
      "${CMAKE_CURRENT_LIST_DIR}/compile_memory.py" "${CMAKE_BINARY_DIR}/compile_memory.tsv")
  foreach(lang CXX CUDA)
    set(CMAKE_${lang}_COMPILER_LAUNCHER ${_samattn_memory_launcher} ${CMAKE_${lang}_COMPILER_LAUNCHER})
  endforeach()
endif()

# Reproducible objects: nvcc names internal-linkage device symbols with a
# random number per compile (..._cu_ab5a1e2e_2701915_...), so two builds of
# one commit differ all over the fatbin. nvcc's -frandom-seed (CUDA 13; 12.4's
# nvcc lacks it) fixes that and is passed on to GCC; the seed is each source's
# path relative to the build or source tree: per file, not per checkout.
function(samattn_reproducible_seeds target)
  execute_process(COMMAND "${CMAKE_CUDA_COMPILER}" --help OUTPUT_VARIABLE nvcc_help
                  ERROR_QUIET)
  string(FIND "${nvcc_help}" "--frandom-seed" nvcc_seed)
  get_target_property(sources ${target} SOURCES)
  foreach(src IN LISTS sources)
    if(src MATCHES "\\.cu$" AND nvcc_seed EQUAL -1)
      continue()
    endif()
    if(IS_ABSOLUTE "${src}")
      set(path "${src}")
    else()
      set(path "${CMAKE_CURRENT_SOURCE_DIR}/${src}")
    endif()
    file(RELATIVE_PATH seed "${CMAKE_BINARY_DIR}" "${path}")
    if(seed MATCHES "^\\.\\./")
      file(RELATIVE_PATH seed "${CMAKE_SOURCE_DIR}" "${path}")
    endif()
    set_property(SOURCE "${src}" APPEND PROPERTY COMPILE_OPTIONS "-frandom-seed=${seed}")
  endforeach()
endfunction()
