# glibc symbol versions: libsamattn must load on glibc 2.28 (manylinux_2_28).
#
# On a host with glibc >= 2.34 the static CUDA runtime's pthread_*, sem_*, dl* and
# shm_* calls bind to GLIBC_2.34, the versions glibc gave them when it moved
# libpthread, libdl and librt into libc. With SAMATTN_GLIBC_COMPAT on, configure
# writes link-time stub libraries (libpthread.so.0, libdl.so.2, librt.so.1) that
# define those functions at their pre-2.34 versions, read from the host's
# libc.so.6, and the library is linked against them ahead of libc: it then
# imports pthread_create@GLIBC_2.2.5 from libpthread.so.0 as a build on an older
# glibc does. The stubs are never installed or loaded (cpp/cmake/glibc_compat.py).
#
#   SAMATTN_GLIBC_COMPAT  AUTO (default), ON or OFF; also read from the
#                         environment. AUTO: on for Linux x86-64 when the host's
#                         libc.so.6 has the 2.34 move (off in the manylinux_2_28
#                         image, whose glibc is 2.28).
#   SAMATTN_GLIBC_MAX     newest glibc version the library may import (2.28, the
#                         platform of ci/variants.toml). After every link the
#                         library's imports are checked against it: an error with
#                         the compat on (or nothing to redirect), a warning when it
#                         was turned off on a newer glibc.
samattn_list_setting(SAMATTN_GLIBC_COMPAT "AUTO" "AUTO, ON or OFF: link against glibc stubs")
samattn_list_setting(SAMATTN_GLIBC_MAX "2.28" "newest glibc symbol version the library may import")

set(_samattn_glibc_script "${CMAKE_CURRENT_LIST_DIR}/glibc_compat.py")

function(samattn_glibc_compat target)
  string(TOUPPER "${SAMATTN_GLIBC_COMPAT}" mode)
  if(NOT mode MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "SAMATTN_GLIBC_COMPAT: '${SAMATTN_GLIBC_COMPAT}' is not AUTO, ON or OFF")
  endif()
  if(NOT CMAKE_SYSTEM_NAME STREQUAL "Linux" OR NOT CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64)$")
    if(mode STREQUAL "ON")
      message(FATAL_ERROR "SAMATTN_GLIBC_COMPAT=ON: only for Linux x86-64")
    endif()
    return()
  endif()
  if(NOT Python_EXECUTABLE)
    find_package(Python COMPONENTS Interpreter REQUIRED)
  endif()
  execute_process(COMMAND "${CMAKE_CXX_COMPILER}" -print-file-name=libc.so.6
                  OUTPUT_VARIABLE libc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(NOT CMAKE_OBJDUMP OR NOT IS_ABSOLUTE "${libc}" OR NOT EXISTS "${libc}")
    set(why "no objdump (${CMAKE_OBJDUMP}) or no libc.so.6 from ${CMAKE_CXX_COMPILER} (${libc})")
    if(mode STREQUAL "ON")
      message(FATAL_ERROR "SAMATTN_GLIBC_COMPAT=ON: ${why}")
    endif()
    message(WARNING "samattn: glibc versions neither redirected nor checked: ${why}")
    return()
  endif()
  get_filename_component(libc "${libc}" REALPATH)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${_samattn_glibc_script}" "${libc}")

  # Without --out the script only lists what it would stub: nothing before glibc 2.34.
  set(out "${CMAKE_BINARY_DIR}/glibc_compat")
  set(write_stubs --compiler "${CMAKE_CXX_COMPILER}" --out "${out}")
  if(mode STREQUAL "OFF")
    set(write_stubs "")
  endif()
  execute_process(
    COMMAND "${Python_EXECUTABLE}" "${_samattn_glibc_script}" stubs --objdump "${CMAKE_OBJDUMP}"
            --libc "${libc}" ${write_stubs}
    RESULT_VARIABLE status OUTPUT_VARIABLE report ERROR_VARIABLE error)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "cpp/cmake/glibc_compat.py stubs: ${report}${error}")
  endif()
  set(stubs "")
  string(REGEX MATCHALL "[^\n]+" lines "${report}")
  foreach(line IN LISTS lines)
    if(line MATCHES "^([^#\t][^\t]*)\t")
      list(APPEND stubs "${CMAKE_MATCH_1}")
    endif()
  endforeach()

  # The check after each link fails on a newer version, unless the compat was turned
  # off where it would have been needed: then it warns.
  set(strict TRUE)
  if(stubs AND mode STREQUAL "OFF")
    set(strict FALSE)
    message(STATUS "samattn: SAMATTN_GLIBC_COMPAT=OFF on a glibc with the 2.34 move "
                   "(${libc}): the library will need glibc 2.34")
  elseif(stubs)
    string(REPLACE "\n" "\n    " report "${report}")
    message(STATUS "samattn: ${libc} has glibc 2.34's move; linking against stubs of the "
                   "old libraries (SAMATTN_GLIBC_COMPAT=${mode}):\n    ${report}")
    # Last on the link line, yet ahead of the implicit libc: the objects and archive
    # members before them take the stubs' versions. No build RPATH: the stubs' folder
    # must never be searched at run time.
    target_link_libraries(${target} PRIVATE ${stubs})
    set_target_properties(${target} PROPERTIES SKIP_BUILD_RPATH TRUE)
  endif()
  if(strict)
    set(warn_only "")
  else()
    set(warn_only "--warn-only")
  endif()
  add_custom_command(
    TARGET ${target} POST_BUILD
    COMMAND "${Python_EXECUTABLE}" "${_samattn_glibc_script}" check --objdump "${CMAKE_OBJDUMP}"
            --max "${SAMATTN_GLIBC_MAX}" ${warn_only} "$<TARGET_FILE:${target}>"
    VERBATIM)
endfunction()
