// SPDX-License-Identifier: BSD-3-Clause
#include "io/files.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "core/error.hpp"

namespace gnh {
namespace fs = std::filesystem;
namespace {

std::string errno_text(int e) { return std::strerror(e); }

// The nearest ancestor of p (p itself included) that exists.
fs::path existing_ancestor(fs::path p) {
  std::error_code ec;
  p = fs::absolute(p, ec).lexically_normal();
  while (!p.empty() && !fs::exists(p, ec)) {
    if (p == p.parent_path()) break;
    p = p.parent_path();
  }
  return p;
}

// dir (to be) a writable directory; see check_output_writable.
void check_directory(const fs::path& dir, const std::string& key, bool create) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    fail(key, ": '", dir.string(), "' exists and is not a directory");
  const fs::path anc = existing_ancestor(dir);
  if (!fs::is_directory(anc, ec))
    fail(key, ": cannot create directory '", dir.string(), "': '", anc.string(), "' is a file, not a directory");
  if (::access(anc.c_str(), W_OK | X_OK) != 0)
    fail(key, ": cannot write in directory '", anc.string(), "': ", errno_text(errno));
  if (!create) return;
  fs::create_directories(dir, ec);
  if (ec) fail(key, ": cannot create directory '", dir.string(), "': ", ec.message());
  const fs::path probe = dir / (".gnh-probe." + std::to_string(::getpid()));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) fail(key, ": cannot write in directory '", dir.string(), "': ", errno_text(errno));
  const bool wrote = ::write(fd, "x", 1) == 1;
  const int write_errno = errno;
  ::close(fd);
  ::unlink(probe.c_str());
  if (!wrote) fail(key, ": cannot write in directory '", dir.string(), "': ", errno_text(write_errno));
}

std::string read_all(int fd) {
  std::string out;
  char buf[512];
  for (off_t at = 0;;) {
    const ssize_t n = ::pread(fd, buf, sizeof(buf), at);
    if (n <= 0) break;
    out.append(buf, std::size_t(n));
    at += n;
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

bool locks_unsupported(int e) { return e == ENOLCK || e == ENOSYS || e == EOPNOTSUPP || e == EINVAL; }

}  // namespace

void require_not_directory(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) fail(path, ": ", what, " is a directory, not a file");
}

void check_output_writable(const std::string& output, const std::string& groups_dir, const std::string& key,
                           bool create) {
  std::error_code ec;
  const fs::path out(output);
  if (fs::is_directory(out, ec))
    fail(key, " = '", output, "' is an existing directory; give the results file's name (e.g. ",
         (out / "results.h5").string(), ")");
  if (fs::exists(out, ec) && !fs::is_regular_file(out, ec))
    fail(key, " = '", output, "' exists and is not a regular file");
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  check_directory(parent, key, create);
  check_directory(fs::path(groups_dir), key, create);
}

std::string OutputLock::lock_path(const std::string& output) { return output + ".lock"; }

OutputLock::OutputLock(const std::string& output, const std::string& command) : path_(lock_path(output)) {
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(path_, ": cannot create the output's lock file: ", errno_text(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    if (locks_unsupported(e)) {
      std::fprintf(stderr, "gnh: WARNING: %s: the file system does not support locks (%s); nothing stops a "
                           "second run from writing %s at the same time\n",
                   path_.c_str(), errno_text(e).c_str(), output.c_str());
      return;
    }
    const std::string who = read_all(fd_);
    ::close(fd_);
    fd_ = -1;
    if (e == EWOULDBLOCK)
      fail(output, ": another gnh run is writing this output (", who.empty() ? "holder unknown" : who,
           "); wait for it to finish, or give this run another run.output");
    fail(path_, ": cannot lock: ", errno_text(e));
  }
  char host[256] = "?";
  ::gethostname(host, sizeof(host) - 1);
  char when[32] = "";
  const std::time_t now = std::time(nullptr);
  std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  const std::string who = cat("pid ", ::getpid(), " on ", host, ", started ", when, ": ", command, "\n");
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, who.data(), who.size(), 0) != ssize_t(who.size()))
    std::fprintf(stderr, "gnh: WARNING: %s: cannot record this run in the lock file: %s\n", path_.c_str(),
                 errno_text(errno).c_str());
}

OutputLock::OutputLock(OutputLock&& o) noexcept : path_(std::move(o.path_)), fd_(o.fd_) { o.fd_ = -1; }

OutputLock& OutputLock::operator=(OutputLock&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

OutputLock::~OutputLock() {
  if (fd_ < 0) return;
  // The file stays (removing it would race a run that has just opened it);
  // emptied, it names no holder.
  [[maybe_unused]] const int rc = ::ftruncate(fd_, 0);
  ::close(fd_);
}

std::string OutputLock::holder(const std::string& output) {
  const int fd = ::open(lock_path(output).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string who;
  if (::flock(fd, LOCK_SH | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      who = read_all(fd);
      if (who.empty()) who = "holder unknown";
    }
  }
  ::close(fd);
  return who;
}

}  // namespace gnh
