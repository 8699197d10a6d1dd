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
