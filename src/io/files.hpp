// SPDX-License-Identifier: BSD-3-Clause
// The file system around a run: inputs that must be regular files, outputs
// that must be writable before anything is computed, and the advisory lock
// that keeps two runs from writing one output.
#pragma once
#include <functional>
#include <string>
#include <string_view>

namespace gnh {

// Fails with "<path>: <what> is a directory" (or missing) unless path names
// something that is not a directory; the caller's open reports the rest.
void require_not_directory(const std::string& path, const std::string& what);

// Checks that `output` and the directory `groups_dir` can be created and
// written: every existing component of their paths is a directory, the output
// itself is not one, and the nearest existing ancestor is writable. With
// create, makes the directories and writes and removes a probe file in each,
// which also catches what permission bits do not show (read-only mounts,
// root on a root-squashed share). `key` names the setting in messages.
void check_output_writable(const std::string& output, const std::string& groups_dir, const std::string& key,
                           bool create);

// Writes `bytes` to path (created or truncated) and syncs it to the disk.
// Fails with the path and the OS's reason (no space, quota, I/O error) at the
// first call that fails: open, write, fsync or close.
void write_file(const std::string& path, std::string_view bytes);
// Appends `bytes` to path (created if missing) in one write and syncs it;
// fails like write_file.
void append_file(const std::string& path, std::string_view bytes);

// Writes path through a temporary beside it (path + ".tmp.<pid>"): `write`
// fills the temporary, which is synced and renamed over path, so that path
// is either the old file or the complete new one. On any failure the
// temporary is removed and the error passed on.
void write_atomically(const std::string& path, const std::function<void(const std::string& tmp)>& write);
void write_file_atomically(const std::string& path, std::string_view bytes);

// Removes the temporaries (PATH.tmp.<pid>) that a killed run left behind:
// those of the file `path`, or of every file in it when path is a directory
// ending in "/". Call it while holding the output's lock (no other run can
// be writing them then). Returns how many it removed.
int remove_stale_temporaries(const std::string& path);

// An exclusive advisory lock (flock) on OUTPUT's lock file (".lock" beside
// it) held for the object's lifetime. The kernel drops it when the process
// ends however it ends, so a crashed run leaves nothing held. The file records
// who holds it (host, pid, start time, command) so that a second run can name
// the first. On a file system without flock support the run proceeds unlocked
// with a warning.
class OutputLock {
 public:
  OutputLock() = default;
  // Fails (a gnh::Error naming the holder) if another process holds it.
  OutputLock(const std::string& output, const std::string& command);
  OutputLock(OutputLock&& o) noexcept;
  OutputLock& operator=(OutputLock&& o) noexcept;
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;
  ~OutputLock();
  const std::string& path() const { return path_; }

  // The holder's description if another process holds OUTPUT's lock, else "".
  static std::string holder(const std::string& output);
  static std::string lock_path(const std::string& output);

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace gnh
