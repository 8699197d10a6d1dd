# What a build contains, written into the build tree and installed with the
# library:
#   build_info.json  archs, families, op groups and head dims built (and the
#                    full lists, so a check can tell a subset from a release),
#                    toolchain versions. tests/cpu/test_binary.py and
#                    ci/check_wheel.py compare it with the embedded fatbin.
#   SBOM             CycloneDX JSON of what is compiled into libsamattn
#                    (CUTLASS, the static CUDA runtime) and with what (nvcc);
#                    in a wheel it sits in .dist-info/sboms/ (PEP 770).
# And the notices that must travel with the binary: CUTLASS's license text,
# taken from where the headers came from (samattn_find_cutlass_license).

function(_samattn_json_list out)
  set(items "")
  foreach(item IN LISTS ARGN)
    list(APPEND items "\"${item}\"")
  endforeach()
  list(JOIN items ", " joined)
  set(${out} "[${joined}]" PARENT_SCOPE)
endfunction()

function(_samattn_cutlass_version out)
  file(READ "${SAMATTN_CUTLASS_INCLUDE_DIR}/cutlass/version.h" version_h)
  foreach(part MAJOR MINOR PATCH)
    string(REGEX MATCH "#define CUTLASS_${part} ([0-9]+)" _ "${version_h}")
    set(cutlass_${part} "${CMAKE_MATCH_1}")
  endforeach()
  set(${out} "${cutlass_MAJOR}.${cutlass_MINOR}.${cutlass_PATCH}" PARENT_SCOPE)
endfunction()

function(samattn_write_build_info path)
  _samattn_json_list(archs ${SAMATTN_CUDA_ARCHS})
  _samattn_json_list(families ${SAMATTN_FAMILIES})
  _samattn_json_list(ops ${SAMATTN_OPS})
  _samattn_json_list(known_ops ${SAMATTN_KNOWN_OPS})
  _samattn_json_list(head_dims ${SAMATTN_ATTENTION_HEAD_DIMS})
  _samattn_json_list(known_head_dims ${SAMATTN_KNOWN_HEAD_DIMS})

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

  _samattn_cutlass_version(cutlass_version)

  set(content
      "{\n"
      "  \"version\": \"${SAMATTN_VERSION}\",\n"
      "  \"archs\": ${archs},\n"
      "  \"families\": ${families},\n"
      "  \"ops\": ${ops},\n"
      "  \"known_ops\": ${known_ops},\n"
      "  \"head_dims\": ${head_dims},\n"
      "  \"known_head_dims\": ${known_head_dims},\n"
      "  \"gencode\": {${gencode}},\n"
      "  \"translation_units\": {${source_counts}},\n"
      "  \"nvcc_version\": \"${CMAKE_CUDA_COMPILER_VERSION}\",\n"
      "  \"cuda_toolkit_version\": \"${CUDAToolkit_VERSION}\",\n"
      "  \"cutlass_version\": \"${cutlass_version}\",\n"
      "  \"build_type\": \"${CMAKE_BUILD_TYPE}\"\n"
      "}\n")
  string(JOIN "" content ${content})
  # Rewrite only on change, so that an unchanged reconfigure relinks nothing.
  file(CONFIGURE OUTPUT "${path}" CONTENT "${content}" @ONLY)
endfunction()

# CUTLASS's license file, next to the headers the build uses: the
# nvidia-cutlass wheel keeps it in its .dist-info/licenses/, a CUTLASS checkout
# at its root. Sets OUT to "" when there is none.
function(samattn_find_cutlass_license out)
  get_filename_component(source "${SAMATTN_CUTLASS_INCLUDE_DIR}/../../.." ABSOLUTE)
  file(GLOB candidates "${source}/nvidia_cutlass-*.dist-info/licenses/LICENSE.txt"
       "${SAMATTN_CUTLASS_INCLUDE_DIR}/../LICENSE.txt")
  list(LENGTH candidates count)
  if(count EQUAL 0)
    set(${out} "" PARENT_SCOPE)
  else()
    list(GET candidates 0 first)
    set(${out} "${first}" PARENT_SCOPE)
  endif()
endfunction()

# CycloneDX 1.6: the library, and what is linked into it. Deterministic (no
# timestamp, no serial number) so that two builds of a commit are identical.
function(samattn_write_sbom path)
  _samattn_cutlass_version(cutlass_version)
  # Comma-separated: a ";" would split the CMake string below into a list.
  list(JOIN SAMATTN_CUDA_ARCHS "," archs)
  list(JOIN SAMATTN_OPS "," ops)
  string(CONCAT content
      "{\n"
      "  \"bomFormat\": \"CycloneDX\",\n"
      "  \"specVersion\": \"1.6\",\n"
      "  \"version\": 1,\n"
      "  \"metadata\": {\n"
      "    \"component\": {\"type\": \"library\", \"bom-ref\": \"samattn\", \"name\": \"samattn\", "
      "\"version\": \"${SAMATTN_VERSION}\",\n"
      "      \"licenses\": [{\"expression\": \"BSD-3-Clause\"}],\n"
      "      \"properties\": [\n"
      "        {\"name\": \"samattn:cuda_archs\", \"value\": \"${archs}\"},\n"
      "        {\"name\": \"samattn:ops\", \"value\": \"${ops}\"},\n"
      "        {\"name\": \"samattn:build_type\", \"value\": \"${CMAKE_BUILD_TYPE}\"}]},\n"
      "    \"tools\": {\"components\": [\n"
      "      {\"type\": \"application\", \"name\": \"nvcc\", \"version\": \"${CMAKE_CUDA_COMPILER_VERSION}\"},\n"
      "      {\"type\": \"application\", \"name\": \"${CMAKE_CXX_COMPILER_ID}\", "
      "\"version\": \"${CMAKE_CXX_COMPILER_VERSION}\"}]}\n"
      "  },\n"
      "  \"components\": [\n"
      "    {\"type\": \"library\", \"bom-ref\": \"cutlass\", \"name\": \"CUTLASS\", "
      "\"version\": \"${cutlass_version}\", \"supplier\": {\"name\": \"NVIDIA Corporation\"},\n"
      "     \"description\": \"header-only templates (CuTe) instantiated into libsamattn\",\n"
      "     \"licenses\": [{\"expression\": \"BSD-3-Clause\"}],\n"
      "     \"purl\": \"pkg:github/NVIDIA/cutlass@v${cutlass_version}\"},\n"
      "    {\"type\": \"library\", \"bom-ref\": \"cudart_static\", \"name\": \"CUDA Runtime (static)\", "
      "\"version\": \"${CUDAToolkit_VERSION}\", \"supplier\": {\"name\": \"NVIDIA Corporation\"},\n"
      "     \"description\": \"libcudart_static.a linked into libsamattn\",\n"
      "     \"licenses\": [{\"license\": {\"name\": \"NVIDIA CUDA Toolkit EULA\"}}]}\n"
      "  ],\n"
      "  \"dependencies\": [{\"ref\": \"samattn\", \"dependsOn\": [\"cutlass\", \"cudart_static\"]}]\n"
      "}\n")
  file(CONFIGURE OUTPUT "${path}" CONTENT "${content}" @ONLY)
endfunction()
