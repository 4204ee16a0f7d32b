# SPDX-License-Identifier: BSD-3-Clause
# Compiles the version, git commit and build configuration into gnh (written into
# every output). The commit is read at configure time and refreshed on every build.
find_package(Git QUIET)
set(GNH_BUILD_INFO_IN ${CMAKE_CURRENT_LIST_DIR}/build_info.cpp.in)
set(GNH_BUILD_INFO_OUT ${CMAKE_BINARY_DIR}/generated/build_info.cpp)
add_custom_target(gnh_build_info
  COMMAND ${CMAKE_COMMAND}
    -DSRC_DIR=${CMAKE_SOURCE_DIR} -DIN=${GNH_BUILD_INFO_IN} -DOUT=${GNH_BUILD_INFO_OUT}
    -DGIT=${GIT_EXECUTABLE} -DVERSION=${PROJECT_VERSION}
    -DBUILD_TYPE=${CMAKE_BUILD_TYPE} -DCXX_ID=${CMAKE_CXX_COMPILER_ID}
    -DCXX_VERSION=${CMAKE_CXX_COMPILER_VERSION}
    -P ${CMAKE_CURRENT_LIST_DIR}/GnhWriteBuildInfo.cmake
  BYPRODUCTS ${GNH_BUILD_INFO_OUT}
  COMMENT "gnh: recording git commit and build configuration")
