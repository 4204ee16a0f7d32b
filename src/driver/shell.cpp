// SPDX-License-Identifier: BSD-3-Clause
#include "driver/shell.hpp"

#include <cstdio>
#include <memory>

#include "core/error.hpp"

namespace gnh {

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string run_capture(const std::string& cmd, int& status) {
  std::string out;
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen(cmd.c_str(), "r"), pclose);
  if (!p) fail("cannot run: ", cmd);
  char buf[512];
  while (std::fgets(buf, sizeof(buf), p.get())) out += buf;
  status = pclose(p.release());
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

}  // namespace gnh
