# SPDX-License-Identifier: BSD-3-Clause
# Script mode: writes build_info.cpp only when its content changes.
set(GNH_GIT_COMMIT "unknown")
if(GIT)
  execute_process(COMMAND ${GIT} -C ${SRC_DIR} rev-parse HEAD
    OUTPUT_VARIABLE _commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _rc)
  if(_rc EQUAL 0)
    set(GNH_GIT_COMMIT ${_commit})
    execute_process(COMMAND ${GIT} -C ${SRC_DIR} status --porcelain --untracked-files=no
      OUTPUT_VARIABLE _dirty OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(_dirty)
      set(GNH_GIT_COMMIT "${GNH_GIT_COMMIT}-dirty")
    endif()
  endif()
endif()
set(GNH_VERSION ${VERSION})
set(GNH_BUILD "${BUILD_TYPE}; ${CXX_ID} ${CXX_VERSION}")
configure_file(${IN} ${OUT}.tmp @ONLY)
file(COPY_FILE ${OUT}.tmp ${OUT} ONLY_IF_DIFFERENT)
