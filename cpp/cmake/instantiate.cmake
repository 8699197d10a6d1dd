# One explicit template instantiation per translation unit.
#
# samattn_instantiate(<op> <family> <name> <header> <declaration>)
# writes build/generated/<op>/<family>/<name>.cu containing
#   #include "<header>"
#   <declaration>
# and compiles it with the family's -gencode flags, but only when both the op
# group (SAMATTN_OPS) and the family (SAMATTN_CUDA_ARCHS) are selected.
set(SAMATTN_GENERATED_DIR "${CMAKE_BINARY_DIR}/generated")

# Common nvcc flags for kernel code.
#
# The fatbin is compressed (the driver decompresses a module when it loads
# it): nvcc >= 12.8's --compress-mode=size makes it 26% smaller than
# compressing every entry with the default algorithm (-Xfatbin=-compress-all,
# what older nvccs get). -lineinfo (source lines for the profilers' source
# view) doubles the compressed fatbin, which a wheel of every arch cannot
# afford under PyPI's 100 MiB (measured on an sm80 attention unit: 646 KB with
# -lineinfo and -compress-all, 324 KB without -lineinfo, 239 KB with
# --compress-mode=size), so only SAMATTN_LINEINFO=ON builds have it.
set(SAMATTN_CUDA_FLAGS --expt-relaxed-constexpr --use_fast_math -Xptxas=--warn-on-spills -DNDEBUG)
if(CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.8)
  list(APPEND SAMATTN_CUDA_FLAGS --compress-mode=size)
else()
  list(APPEND SAMATTN_CUDA_FLAGS -Xfatbin=-compress-all)
endif()
if(SAMATTN_LINEINFO)
  list(APPEND SAMATTN_CUDA_FLAGS -lineinfo)
endif()

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
