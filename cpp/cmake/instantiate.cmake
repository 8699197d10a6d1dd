# One explicit template instantiation per translation unit.
#
# samattn_instantiate(<op> <family> <name> <header> <declaration>)
# writes build/generated/<op>/<family>/<name>.cu containing
#   #include "<header>"
#   <declaration>
# and compiles it with the family's -gencode flags, but only when both the op
# group (SAMATTN_OPS) and the family (SAMATTN_CUDA_ARCHS) are selected.
set(SAMATTN_GENERATED_DIR "${CMAKE_BINARY_DIR}/generated")

# Common nvcc flags for kernel code. -lineinfo (source lines for the
# profilers) makes SASS ~4x larger; compressing every fatbin entry brings the
# library back from ~120 MiB to a fraction of that (the driver decompresses a
# module when it loads it).
set(SAMATTN_CUDA_FLAGS
    --expt-relaxed-constexpr
    --use_fast_math
    -Xptxas=--warn-on-spills
    -lineinfo
    -Xfatbin=-compress-all
    -DNDEBUG)

# samattn_family_sources(<op> <family> <source>...): hand-written family code
# (dispatch) compiled with that family's flags.
function(samattn_family_sources op family)
  if(NOT op IN_LIST SAMATTN_OPS OR NOT family IN_LIST SAMATTN_FAMILIES)
    return()
  endif()
  samattn_family_gencode(${family} gencode)
  foreach(src IN LISTS ARGN)
    target_sources(samattn PRIVATE "${src}")
    set_source_files_properties("${src}" PROPERTIES COMPILE_OPTIONS "${gencode};${SAMATTN_CUDA_FLAGS}")
    # Counted per family for build_info.json (see build_info.cmake).
    set_property(GLOBAL APPEND PROPERTY SAMATTN_SOURCES_${family} "${src}")
  endforeach()
  target_include_directories(samattn PRIVATE "${SAMATTN_CUTLASS_INCLUDE_DIR}")
endfunction()

function(samattn_instantiate op family name header declaration)
  if(NOT op IN_LIST SAMATTN_OPS OR NOT family IN_LIST SAMATTN_FAMILIES)
    return()
  endif()
  set(file "${SAMATTN_GENERATED_DIR}/${op}/${family}/${name}.cu")
  set(content "// Generated at configure time (cpp/instantiations.cmake); do not edit.\n#include \"${header}\"\n\n${declaration}\n")
  if(EXISTS "${file}")
    file(READ "${file}" old)
  else()
    set(old "")
  endif()
  if(NOT old STREQUAL content)
    file(WRITE "${file}" "${content}")
  endif()
  samattn_family_sources(${op} ${family} "${file}")
endfunction()
