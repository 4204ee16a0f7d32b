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

namespace {
void write_fd(int flags, const std::string& path, std::string_view bytes) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC, 0644);
  if (fd < 0) fail(path, ": cannot open for writing: ", errno_text(errno));
  const char* p = bytes.data();
  std::size_t left = bytes.size();
  while (left > 0) {
    const ssize_t w = ::write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int e = w < 0 ? errno : EIO;
      ::close(fd);
      fail(path, ": cannot write: ", errno_text(e));
    }
    p += w;
    left -= std::size_t(w);
  }
  // A network or quota-enforcing file system may report the failure only here.
  if (::fsync(fd) != 0) {
    const int e = errno;
    ::close(fd);
    fail(path, ": cannot write (sync): ", errno_text(e));
  }
  if (::close(fd) != 0) fail(path, ": cannot write (close): ", errno_text(errno));
}
}  // namespace

void write_file(const std::string& path, std::string_view bytes) {
  write_fd(O_WRONLY | O_CREAT | O_TRUNC, path, bytes);
}

void append_file(const std::string& path, std::string_view bytes) {
  write_fd(O_WRONLY | O_CREAT | O_APPEND, path, bytes);
}

void write_atomically(const std::string& path, const std::function<void(const std::string& tmp)>& write) {
  const fs::path target(path);
  if (target.has_parent_path()) {
    std::error_code ec;
    fs::create_directories(target.parent_path(), ec);
    if (ec) fail(path, ": cannot create directory ", target.parent_path().string(), ": ", ec.message());
  }
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  try {
    write(tmp);
    const int fd = ::open(tmp.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(tmp, ": cannot reopen to sync: ", errno_text(errno));
    const int rc = ::fsync(fd);
    const int e = errno;
    ::close(fd);
    if (rc != 0) fail(tmp, ": cannot write (sync): ", errno_text(e));
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    fail(path, ": cannot rename ", tmp, " into place: ", errno_text(e));
  }
  // Make the rename itself durable.
  const std::string dir = target.has_parent_path() ? target.parent_path().string() : ".";
  const int fd = ::open(dir.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

void write_file_atomically(const std::string& path, std::string_view bytes) {
  write_atomically(path, [&](const std::string& tmp) { write_file(tmp, bytes); });
}

int remove_stale_temporaries(const std::string& path) {
  const fs::path p(path);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  const std::string stem = p.filename().string();
  std::error_code ec;
  int removed = 0;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const std::size_t at = name.rfind(".tmp.");
    // NAME.tmp.<pid> for NAME = the prefix's file name, or any NAME in a
    // directory given as "dir/".
    if (at == std::string::npos || (stem.empty() ? at == 0 : at != stem.size() || name.compare(0, at, stem) != 0))
      continue;
    const std::string pid = name.substr(at + 5);
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::error_code rm;
    if (fs::remove(it->path(), rm)) ++removed;
  }
  return removed;
}

std::string OutputLock::lock_path(const std::string& output) { return output + ".lock"; }

OutputLock::OutputLock(const std::string& output, const std::string& command) : path_(lock_path(output)) {
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(path_, ": cannot create the output's lock file: ", errno_text(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    if (locks_unsupported(e)) {
      std::fprintf(stderr,
                   "gnh: WARNING: %s: the file system does not support locks (%s); nothing stops a "
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
