# SPDX-License-Identifier: BSD-3-Clause
# Cross build for 64-bit Arm Linux (the Grace host of GH200 nodes) on a Debian
# x86-64 machine: Debian's cross compiler (g++-aarch64-linux-gnu, its C
# library in /usr/aarch64-linux-gnu) and arm64 libraries installed through
# multiarch (/usr/lib/aarch64-linux-gnu, CMake packages in its cmake/). Tests
# and other target programs run under qemu-user. cmake/cross-aarch64.sh
# installs all of it and uses this file.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

# Multiarch keeps both architectures under one root: libraries and packages
# are found in lib/aarch64-linux-gnu (CMAKE_LIBRARY_ARCHITECTURE), programs
# (python, git) are the build machine's.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)

# ctest runs target programs through qemu. The arm64 loader and libc come
# from libc6:arm64 (multiarch), so no -L is needed. qemu's most capable CPU
# has SVE2 but 512-bit vectors by default; Grace's are 128-bit.
# The project's -march is GNH_HOST_ARCH (cmake/cross-aarch64.sh passes
# armv9-a); the default, native, means nothing to a cross compiler and is
# dropped.
set(GNH_QEMU_CPU "max,sve-default-vector-length=16" CACHE STRING "qemu-aarch64 -cpu for running tests")
find_program(GNH_QEMU_AARCH64 qemu-aarch64 REQUIRED)
set(CMAKE_CROSSCOMPILING_EMULATOR ${GNH_QEMU_AARCH64} -cpu ${GNH_QEMU_CPU})
