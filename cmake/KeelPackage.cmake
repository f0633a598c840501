# keel as a library a studio installs (docs/api-stability.md, README "Install and link"):
#
#   libkeel.so.<SOVERSION> + libkeel.a  one library for users, holding the
#                                       runtime, libkeel_wal and keel_base
#                                       objects, so link order is never the
#                                       user's problem
#   include/keel/*.h                    the public headers
#   lib/pkgconfig/keel.pc               pkg-config
#   lib/cmake/keel/                     find_package(keel): keel::keel (shared),
#                                       keel::keel_static
#   bin/keel-world keel-wal keel-crash  the tools; libexec/keel/libkeel_powerloss.so
#                                       (keel-crash's power-loss shim)
#   share/man/man1, man3                the man pages of man/
#
# The tools and the tests keep linking the internal static libraries (keel,
# keel_wal, keel_base): keel-wal must link without the runtime.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# 0.x: every minor release may change the ABI, so the SONAME carries
# MAJOR.MINOR (libkeel.so.0.2) and the CMake package accepts the same minor
# version only; from 1.0 on, both go by the major version.
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(KEEL_SOVERSION "${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR}")
  set(keel_compat SameMinorVersion)
else()
  set(KEEL_SOVERSION "${PROJECT_VERSION_MAJOR}")
  set(keel_compat SameMajorVersion)
endif()

# The user libraries are made of the internal libraries' objects (compiled
# once), which the shared library needs position-independent.
set_target_properties(keel keel_wal keel_repl keel_base PROPERTIES POSITION_INDEPENDENT_CODE ON)
# the internal runtime archive is libkeel_runtime.a, so that libkeel.a always means the user library
set_target_properties(keel PROPERTIES OUTPUT_NAME keel_runtime)
set(keel_user_objects $<TARGET_OBJECTS:keel> $<TARGET_OBJECTS:keel_wal> $<TARGET_OBJECTS:keel_repl> $<TARGET_OBJECTS:keel_base>)
set(keel_user_dir ${PROJECT_BINARY_DIR}/lib)

add_library(keel_shared SHARED ${keel_user_objects})
add_library(keel_static STATIC ${keel_user_objects})
foreach(t keel_shared keel_static)
  target_include_directories(${t} INTERFACE $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
                                            $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  set_target_properties(${t} PROPERTIES OUTPUT_NAME keel LINKER_LANGUAGE C
                        ARCHIVE_OUTPUT_DIRECTORY ${keel_user_dir} LIBRARY_OUTPUT_DIRECTORY ${keel_user_dir})
endforeach()
set_target_properties(keel_shared PROPERTIES EXPORT_NAME keel
                      VERSION ${PROJECT_VERSION} SOVERSION ${KEEL_SOVERSION})
set_target_properties(keel_static PROPERTIES EXPORT_NAME keel_static)
# Only the public keel_ names leave the shared library: the internal ones
# (core_*, kw_*, ...) stay free to change without touching the ABI.
set(keel_symbols ${PROJECT_SOURCE_DIR}/cmake/keel.sym)
target_link_options(keel_shared PRIVATE LINKER:--version-script=${keel_symbols})
set_property(TARGET keel_shared APPEND PROPERTY LINK_DEPENDS ${keel_symbols})
if(KEEL_SANITIZE STREQUAL "" AND NOT KEEL_FUZZ)
  # every symbol the library uses is resolved at its own link (sanitizer
  # runtimes are linked into the executable, so not there)
  target_link_options(keel_shared PRIVATE LINKER:--no-undefined)
endif()
target_link_libraries(keel_shared PRIVATE PkgConfig::LMDB PkgConfig::URCU PkgConfig::ZSTD PkgConfig::NATS Threads::Threads)
# A static user links the dependencies itself: by their plain names (the
# Debian packages put them on the default library path), so the exported
# target needs no pkg-config at find_package time.
target_link_libraries(keel_static PRIVATE ${LMDB_LIBRARIES} ${URCU_LIBRARIES} ${ZSTD_LIBRARIES} ${NATS_LIBRARIES} Threads::Threads)

# ---- install -------------------------------------------------------------------
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/keel DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")
install(TARGETS keel_shared keel_static EXPORT keelTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS keel-world keel-wal keel-crash RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS keel_powerloss LIBRARY DESTINATION ${CMAKE_INSTALL_LIBEXECDIR}/keel)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/man/ DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 FILES_MATCHING PATTERN "*.1")
install(DIRECTORY ${PROJECT_SOURCE_DIR}/man/ DESTINATION ${CMAKE_INSTALL_MANDIR}/man3 FILES_MATCHING PATTERN "*.3")

# keel.pc finds its prefix from its own place (${pcfiledir}), so an install
# with `cmake --install --prefix P` anywhere gives a working keel.pc.
file(RELATIVE_PATH keel_pc_to_prefix /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
string(REGEX REPLACE "/$" "" keel_pc_to_prefix "${keel_pc_to_prefix}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/keel.pc.in ${PROJECT_BINARY_DIR}/keel.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/keel.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

set(keel_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/keel)
install(EXPORT keelTargets NAMESPACE keel:: DESTINATION ${keel_cmake_dir})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/keelConfig.cmake.in ${PROJECT_BINARY_DIR}/keelConfig.cmake
                              INSTALL_DESTINATION ${keel_cmake_dir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/keelConfigVersion.cmake COMPATIBILITY ${keel_compat})
install(FILES ${PROJECT_BINARY_DIR}/keelConfig.cmake ${PROJECT_BINARY_DIR}/keelConfigVersion.cmake
        DESTINATION ${keel_cmake_dir})

# keel-crash finds its power-loss shim beside itself in the build tree, and
# installed at this path relative to its own directory.
file(RELATIVE_PATH keel_shim_dir /prefix/${CMAKE_INSTALL_BINDIR} /prefix/${CMAKE_INSTALL_LIBEXECDIR}/keel)
target_compile_definitions(keel-crash PRIVATE KEEL_CRASH_SHIM_DIR="${keel_shim_dir}")
