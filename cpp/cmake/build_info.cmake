# build_info.json: what this build was asked for, written next to libsamattn
# and installed with it. The wheel-content tests (tests/cpu/test_binary.py)
# compare it with the fatbin actually embedded in the library, and
# `python -m samattn.info` can show it.

function(_samattn_json_list out)
  set(items "")
  foreach(item IN LISTS ARGN)
    list(APPEND items "\"${item}\"")
  endforeach()
  list(JOIN items ", " joined)
  set(${out} "[${joined}]" PARENT_SCOPE)
endfunction()

function(samattn_write_build_info path)
  _samattn_json_list(archs ${SAMATTN_CUDA_ARCHS})
  _samattn_json_list(families ${SAMATTN_FAMILIES})
  _samattn_json_list(ops ${SAMATTN_OPS})

  # Per family: its nvcc arch flags and how many translation units use them
  # (a family with none has no device code in the library).
  set(gencode_items "")
  set(source_items "")
  foreach(family IN LISTS SAMATTN_FAMILIES)
    samattn_family_gencode(${family} flags)
    list(APPEND gencode_items "\"${family}\": \"${flags}\"")
    get_property(sources GLOBAL PROPERTY SAMATTN_SOURCES_${family})
    list(LENGTH sources count)
    list(APPEND source_items "\"${family}\": ${count}")
  endforeach()
  list(JOIN gencode_items ", " gencode)
  list(JOIN source_items ", " source_counts)

  file(READ "${SAMATTN_CUTLASS_INCLUDE_DIR}/cutlass/version.h" version_h)
  foreach(part MAJOR MINOR PATCH)
    string(REGEX MATCH "#define CUTLASS_${part} ([0-9]+)" _ "${version_h}")
    set(cutlass_${part} "${CMAKE_MATCH_1}")
  endforeach()

  set(content
      "{\n"
      "  \"version\": \"${SAMATTN_VERSION}\",\n"
      "  \"archs\": ${archs},\n"
      "  \"families\": ${families},\n"
      "  \"ops\": ${ops},\n"
      "  \"gencode\": {${gencode}},\n"
      "  \"translation_units\": {${source_counts}},\n"
      "  \"nvcc_version\": \"${CMAKE_CUDA_COMPILER_VERSION}\",\n"
      "  \"cuda_toolkit_version\": \"${CUDAToolkit_VERSION}\",\n"
      "  \"cutlass_version\": \"${cutlass_MAJOR}.${cutlass_MINOR}.${cutlass_PATCH}\",\n"
      "  \"build_type\": \"${CMAKE_BUILD_TYPE}\"\n"
      "}\n")
  string(JOIN "" content ${content})
  # Rewrite only on change, so that an unchanged reconfigure relinks nothing.
  file(CONFIGURE OUTPUT "${path}" CONTENT "${content}" @ONLY)
endfunction()
