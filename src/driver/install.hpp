// SPDX-License-Identifier: BSD-3-Clause
// Where gnh finds the files it runs beside itself (doc/install.md): in an
// installed tree PREFIX/bin/gnh finds PREFIX/share/gnh (jobscripts, timing
// profiles, Python helpers); in a build tree, the source tree. Nothing else
// is compiled in, so an installed tree can be moved (a cluster module).
#pragma once
#include <filesystem>

namespace gnh {

// The directory of the running executable.
std::filesystem::path executable_directory();
// PREFIX/share/gnh of an installed tree, else the source tree; both hold
// jobscripts/ (with profiles/) and the Python helpers.
std::filesystem::path share_directory();

}  // namespace gnh
