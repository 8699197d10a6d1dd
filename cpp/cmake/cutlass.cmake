# CUTLASS headers come from the nvidia-cutlass wheel (a build requirement);
# nothing is fetched and no CUTLASS source lives in this repository.
if(NOT SAMATTN_CUTLASS_INCLUDE_DIR)
  find_package(Python COMPONENTS Interpreter REQUIRED)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
            "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))"
    OUTPUT_VARIABLE SAMATTN_CUTLASS_INCLUDE_DIR
    OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _cutlass_rc)
  if(NOT _cutlass_rc EQUAL 0 OR NOT EXISTS "${SAMATTN_CUTLASS_INCLUDE_DIR}/cute/tensor.hpp")
    message(FATAL_ERROR "CUTLASS headers not found: install the nvidia-cutlass wheel "
                        "(pip install nvidia-cutlass) or set SAMATTN_CUTLASS_INCLUDE_DIR.")
  endif()
endif()
find_package(CUDAToolkit REQUIRED)
