# Kernel families and the archs each is compiled for (docs/design.md section 2).
#
# A family is compiled from its own virtual arch (compute_75, compute_80,
# compute_90a) so that no instruction newer than the family leaks in (an sm_80
# atom compiled for sm_75 becomes a trap). Its machine code (SASS) is emitted
# for every requested arch the family can run on, so that an older family can
# be forced and tested on a newer GPU without JIT; the sm80 family also embeds
# compute_80 PTX, which is how GPUs newer than the wheel run.
#
#   sm75 family: built when 75 is requested; SASS for every requested arch.
#   sm80 family: built when any of 80, 86, 89 (or a plain arch >= 100) is
#                requested; SASS for every requested arch >= 80, plus PTX.
#   sm90 family: built when 90a is requested; SASS for sm_90a only (wgmma
#                and setmaxnreg exist only there). 90a also gives the older
#                families sm_90 SASS, so they can be forced on Hopper.

set(_real_archs "")
set(SAMATTN_FAMILIES "")
set(_want_sm80 OFF)
foreach(arch IN LISTS SAMATTN_CUDA_ARCHS)
  if(NOT arch MATCHES "^([0-9]+)([af]?)$")
    message(FATAL_ERROR "SAMATTN_CUDA_ARCHS: '${arch}' is not an arch like 80 or 90a")
  endif()
  set(_num "${CMAKE_MATCH_1}")
  if(_num LESS 75)
    message(FATAL_ERROR "SAMATTN_CUDA_ARCHS: sm_${arch} is older than Turing (sm_75), the oldest supported")
  endif()
  # Arch-specific targets (90a) run only on that exact chip; the older
  # families get plain SASS for it.
  list(APPEND _real_archs "${_num}")
  if(_num EQUAL 75)
    list(APPEND SAMATTN_FAMILIES sm75)
  elseif(_num GREATER_EQUAL 80 AND _num LESS 90)
    set(_want_sm80 ON)
  elseif(_num EQUAL 90 AND "${CMAKE_MATCH_2}" STREQUAL "a")
    list(APPEND SAMATTN_FAMILIES sm90)
    set(_want_sm80 ON)
  elseif(_num GREATER_EQUAL 100 OR (_num EQUAL 90 AND "${CMAKE_MATCH_2}" STREQUAL ""))
    set(_want_sm80 ON)
  endif()
endforeach()
if(_want_sm80)
  list(APPEND SAMATTN_FAMILIES sm80)
endif()
list(REMOVE_DUPLICATES _real_archs)
list(REMOVE_DUPLICATES SAMATTN_FAMILIES)
if(NOT SAMATTN_FAMILIES)
  message(FATAL_ERROR "SAMATTN_CUDA_ARCHS='${SAMATTN_CUDA_ARCHS}' selects no kernel family")
endif()

# samattn_family_gencode(<family> <out-var>): nvcc flags for that family.
function(samattn_family_gencode family out)
  string(REGEX REPLACE "^sm" "" fam_num "${family}")
  set(codes "")
  if(family STREQUAL "sm90")
    set(flags "-gencode=arch=compute_90a,code=sm_90a")
  else()
    foreach(num IN LISTS _real_archs)
      if(num GREATER_EQUAL fam_num)
        list(APPEND codes "sm_${num}")
      endif()
    endforeach()
    if(family STREQUAL "sm80")
      list(APPEND codes "compute_80")
    endif()
    list(JOIN codes "," codes)
    set(flags "-gencode=arch=compute_${fam_num},code=[${codes}]")
  endif()
  set(${out} "${flags}" PARENT_SCOPE)
endfunction()
