// SPDX-License-Identifier: BSD-3-Clause
#include "driver/install.hpp"

namespace gnh {

namespace fs = std::filesystem;

fs::path executable_directory() {
  std::error_code ec;
  const fs::path exe = fs::canonical("/proc/self/exe", ec);
  return ec ? fs::path(".") : exe.parent_path();
}

fs::path share_directory() {
  const fs::path installed = executable_directory().parent_path() / "share" / "gnh";
  std::error_code ec;
  if (fs::is_directory(installed / "jobscripts", ec)) return installed;
  return fs::path(GNH_SOURCE_DIR);
}

}  // namespace gnh
