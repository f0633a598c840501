# Fails the configuration when the KEEL_VERSION_* macros of a version header
# differ from the project version, so that the headers, the SONAME, keel.pc
# and the CMake package can never disagree.
#
# Included by CMakeLists.txt with KEEL_VERSION_HEADER and KEEL_EXPECTED_VERSION
# set, or run as a script (the test version_check_detects):
#   cmake -DKEEL_VERSION_HEADER=FILE -DKEEL_EXPECTED_VERSION=X.Y.Z -P cmake/check_version.cmake
if(NOT EXISTS "${KEEL_VERSION_HEADER}")
  message(FATAL_ERROR "version check: ${KEEL_VERSION_HEADER} does not exist")
endif()
file(READ "${KEEL_VERSION_HEADER}" _kv_text)
set(_kv_found "")
foreach(_kv_part MAJOR MINOR PATCH)
  if(NOT _kv_text MATCHES "#define KEEL_VERSION_${_kv_part} ([0-9]+)")
    message(FATAL_ERROR "version check: ${KEEL_VERSION_HEADER} defines no KEEL_VERSION_${_kv_part}")
  endif()
  list(APPEND _kv_found "${CMAKE_MATCH_1}")
endforeach()
list(JOIN _kv_found "." _kv_numbers)
if(NOT _kv_text MATCHES "#define KEEL_VERSION_STRING \"([^\"]*)\"")
  message(FATAL_ERROR "version check: ${KEEL_VERSION_HEADER} defines no KEEL_VERSION_STRING")
endif()
set(_kv_string "${CMAKE_MATCH_1}")
if(NOT _kv_numbers STREQUAL KEEL_EXPECTED_VERSION OR NOT _kv_string STREQUAL KEEL_EXPECTED_VERSION)
  message(FATAL_ERROR "version check: ${KEEL_VERSION_HEADER} says ${_kv_numbers} (\"${_kv_string}\") "
                      "but CMakeLists.txt's project() says ${KEEL_EXPECTED_VERSION}: change both together")
endif()
