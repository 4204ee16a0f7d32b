// SPDX-License-Identifier: BSD-3-Clause
#include "driver/gemm_record.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.hpp"
#include "core/isa.hpp"
#include "io/files.hpp"
#include "io/results.hpp"
#include "kernels/gemm_probe.hpp"

namespace gnh {
namespace {

using json = nlohmann::json;

// An exclusive flock on PATH, held while the object lives; waits for another
// holder (a shard probing this class) rather than failing.
class RecordLock {
 public:
  explicit RecordLock(const std::string& path) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) fail(path, ": cannot create the host GEMM record's lock (", std::strerror(errno), ")");
    while (::flock(fd_, LOCK_EX) != 0)
      if (errno != EINTR) fail(path, ": cannot lock (", std::strerror(errno), ")");
  }
  RecordLock(const RecordLock&) = delete;
  RecordLock& operator=(const RecordLock&) = delete;
  ~RecordLock() { ::close(fd_); }

 private:
  int fd_ = -1;
};

json read_record(const std::string& path) {
  if (!std::filesystem::exists(path)) return json{{"format", "gnh-host-gemm"}, {"classes", json::object()}};
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  json r = json::parse(text.str(), nullptr, false);
  if (r.is_discarded() || !r.is_object() || r.value("format", "") != "gnh-host-gemm" || !r.contains("classes") ||
      !r["classes"].is_object())
    fail(path, ": not a gnh host GEMM record (remove it, and the campaign's next run probes again)");
  return r;
}

GemmChoice recorded_choice(const json& entry, const std::string& path, const std::string& cls) {
  GemmChoice c;
  c.kernel = entry.value("kernel", "");
  const auto k = kernels::host::kernel_named(c.kernel);
  if (!k || (*k != kernels::host::GemmKernel::none && !kernels::host::supported(*k)))
    fail(path, ": the kernel recorded for ", cls, " (\"", c.kernel, "\") does not run on this CPU");
  c.probe = entry.contains("probe") ? entry["probe"].dump() : "";
  c.how = "recorded for this campaign on " + cls + " by " + entry.value("recorded_by", "?") + " (" +
          entry.value("source", "?") + "), in " + path;
  return c;
}

}  // namespace

std::string gemm_record_path(const std::string& campaign_output) {
  return with_suffix(campaign_output, ".host-gemm.json");
}

GemmChoice campaign_host_gemm(const std::string& campaign_output, const std::string& who, index_t n_embd,
                              index_t vocab_size, index_t rows) {
  const std::string path = gemm_record_path(campaign_output);
  const std::string cls = host_cpu_class();
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  RecordLock lock(path + ".lock");
  json record = read_record(path);
  json& classes = record["classes"];
  const bool known = classes.contains(cls);
  if (known && !kernels::host::kernel_forced()) return recorded_choice(classes[cls], path, cls);
  // Pinned, or the first run of the campaign on this class: probe (or take
  // the pin) and, for a class without a record, record it.
  const kernels::GemmProbe p = kernels::choose_host_gemm(n_embd, vocab_size, rows);
  GemmChoice c{kernels::host::name(p.chosen), p.json(), p.reason};
  if (known) {
    const std::string recorded = classes[cls].value("kernel", "");
    if (recorded != c.kernel)
      c.how += "; the campaign's record for this class says " + recorded + " (" + path +
               "): these groups' last bits differ from its other groups'";
    return c;
  }
  classes[cls] = {{"kernel", c.kernel},
                  {"recorded_by", who},
                  {"source", kernels::host::kernel_forced() ? "GNH_HOST_GEMM" : "probe"},
                  {"probe", json::parse(c.probe, nullptr, false)}};
  if (classes[cls]["probe"].is_discarded()) classes[cls]["probe"] = c.probe;
  write_file_atomically(path, record.dump(2) + "\n");
  c.how += "; recorded for this campaign on " + cls + " in " + path;
  return c;
}

}  // namespace gnh
