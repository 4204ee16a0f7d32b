# SPDX-License-Identifier: BSD-3-Clause
# Finds gnh's dependencies and papers over packaging differences, exposing
#   gnh::kokkos        Kokkos core (+ containers)
#   gnh::kokkoskernels Kokkos Kernels (BLAS through the TPL when available)
#   gnh::mpi, gnh::hdf5, CLI11::CLI11, tomlplusplus::tomlplusplus (with GNH_ENABLE_MPI)
#
# Debian's Trilinos packaging (Kokkos 3.4) exports Kokkos::kokkos with an include
# directory that lacks the headers (they are in include/trilinos) and has no
# Kokkos::kokkoskernels target; a cluster's Kokkos >= 4 (Kokkos_ROOT) is used as is.

find_package(Kokkos REQUIRED)
# Kokkos Kernels from the same prefix as Kokkos unless told otherwise
# (cmake/build-kokkos.sh installs both into one prefix); otherwise a system
# Kokkos Kernels built against another Kokkos would be found first.
if(NOT KokkosKernels_ROOT AND NOT DEFINED ENV{KokkosKernels_ROOT})
  if(Kokkos_ROOT)
    set(KokkosKernels_ROOT "${Kokkos_ROOT}")
  elseif(DEFINED ENV{Kokkos_ROOT})
    set(KokkosKernels_ROOT "$ENV{Kokkos_ROOT}")
  endif()
endif()
find_package(KokkosKernels REQUIRED)
if(TARGET trilinos_kokkoskernels AND Kokkos_VERSION VERSION_GREATER_EQUAL 4)
  message(FATAL_ERROR "gnh: Kokkos ${Kokkos_VERSION} (${Kokkos_DIR}) but the Trilinos Kokkos Kernels of "
                      "Kokkos 3 (${KokkosKernels_DIR}); set KokkosKernels_ROOT to the Kokkos Kernels built "
                      "against this Kokkos")
endif()

add_library(gnh_kokkos INTERFACE)
target_link_libraries(gnh_kokkos INTERFACE Kokkos::kokkos)
# Only where the exported include directory lacks the headers (Debian's
# TriBITS export) look for them in include/trilinos beside it.
get_target_property(_gnh_kokkos_inc Kokkos::kokkos INTERFACE_INCLUDE_DIRECTORIES)
set(_gnh_kokkos_headers_found FALSE)
foreach(_dir IN LISTS _gnh_kokkos_inc)
  if(EXISTS "${_dir}/Kokkos_Core.hpp")
    set(_gnh_kokkos_headers_found TRUE)
  endif()
endforeach()
if(NOT _gnh_kokkos_headers_found)
  # Debian's export names <prefix>/lib/include; the headers are in
  # <prefix>/include/trilinos.
  find_path(GNH_KOKKOS_INCLUDE_DIR Kokkos_Core.hpp
    HINTS ${_gnh_kokkos_inc} ${Kokkos_DIR}/../../../../include ${Kokkos_DIR}/../../../include
    PATH_SUFFIXES trilinos)
  if(NOT GNH_KOKKOS_INCLUDE_DIR)
    message(FATAL_ERROR "gnh: Kokkos found at ${Kokkos_DIR} but not its headers (Kokkos_Core.hpp)")
  endif()
  target_include_directories(gnh_kokkos SYSTEM INTERFACE ${GNH_KOKKOS_INCLUDE_DIR})
endif()
add_library(gnh::kokkos ALIAS gnh_kokkos)
# Debian's export also links Kokkos core with <multiarch libdir>/libdl.a by
# absolute path, which only that architecture's libc6-dev provides. A cross
# build (cmake/cross-aarch64.sh) links the cross compiler's own C library, so
# a missing one is named by the platform's flag instead (-ldl).
if(TARGET trilinos_kokkoscore)
  get_target_property(_gnh_core_libs trilinos_kokkoscore INTERFACE_LINK_LIBRARIES)
  set(_gnh_core_libs_fixed "")
  set(_gnh_core_libs_changed FALSE)
  foreach(_lib IN LISTS _gnh_core_libs)
    if(_lib MATCHES "^/.*/libdl\\.(a|so)$" AND NOT EXISTS "${_lib}")
      list(APPEND _gnh_core_libs_fixed ${CMAKE_DL_LIBS})
      set(_gnh_core_libs_changed TRUE)
    else()
      list(APPEND _gnh_core_libs_fixed "${_lib}")
    endif()
  endforeach()
  if(_gnh_core_libs_changed)
    set_property(TARGET trilinos_kokkoscore PROPERTY INTERFACE_LINK_LIBRARIES "${_gnh_core_libs_fixed}")
  endif()
endif()

add_library(gnh_kokkoskernels INTERFACE)
if(TARGET Kokkos::kokkoskernels)
  target_link_libraries(gnh_kokkoskernels INTERFACE Kokkos::kokkoskernels gnh::kokkos)
elseif(TARGET trilinos_kokkoskernels)
  target_link_libraries(gnh_kokkoskernels INTERFACE trilinos_kokkoskernels gnh::kokkos)
  if(KokkosKernels_INCLUDE_DIRS)
    target_include_directories(gnh_kokkoskernels SYSTEM INTERFACE ${KokkosKernels_INCLUDE_DIRS})
  endif()
else()
  message(FATAL_ERROR "gnh: found KokkosKernels but neither Kokkos::kokkoskernels nor trilinos_kokkoskernels")
endif()
add_library(gnh::kokkoskernels ALIAS gnh_kokkoskernels)

if(GNH_ENABLE_MPI)
  find_package(MPI REQUIRED COMPONENTS C CXX)
  add_library(gnh_mpi INTERFACE)
  target_link_libraries(gnh_mpi INTERFACE MPI::MPI_CXX)
  add_library(gnh::mpi ALIAS gnh_mpi)

  set(HDF5_PREFER_PARALLEL ON)
  find_package(HDF5 REQUIRED COMPONENTS C)
  add_library(gnh_hdf5 INTERFACE)
  if(TARGET HDF5::HDF5)
    target_link_libraries(gnh_hdf5 INTERFACE HDF5::HDF5)
  else()
    target_include_directories(gnh_hdf5 SYSTEM INTERFACE ${HDF5_C_INCLUDE_DIRS} ${HDF5_INCLUDE_DIRS})
    target_link_libraries(gnh_hdf5 INTERFACE ${HDF5_C_LIBRARIES})
    target_compile_definitions(gnh_hdf5 INTERFACE ${HDF5_C_DEFINITIONS})
  endif()
  # Parallel HDF5's headers include mpi.h.
  target_link_libraries(gnh_hdf5 INTERFACE MPI::MPI_C)
  add_library(gnh::hdf5 ALIAS gnh_hdf5)

  find_package(CLI11 REQUIRED)
  find_package(tomlplusplus REQUIRED)
  find_package(nlohmann_json REQUIRED)
endif()

if(GNH_ENABLE_TESTS)
  find_package(Catch2 2 REQUIRED)
endif()
