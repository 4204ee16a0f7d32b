// SPDX-License-Identifier: BSD-3-Clause
#include "io/results.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "core/build_info.hpp"
#include "core/error.hpp"
#include "io/hdf5.hpp"

namespace gnh {
namespace {

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) fail(path, ": cannot reopen to sync");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) fail(path, ": fsync failed");
}

}  // namespace

void write_results(const std::string& path, const RunInfo& info,
                   const std::vector<GroupResult>& groups) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  if (target.has_parent_path()) {
    std::error_code ec;
    fs::create_directories(target.parent_path(), ec);
    if (ec) fail(path, ": cannot create output directory: ", ec.message());
  }
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    h5::File f = h5::File::create(tmp);
    const hid_t root = f.id();
    h5::write_attr(root, "format", std::string("gnh-results"));
    h5::write_attr(root, "format_version", std::int64_t(1));
    h5::write_attr(root, "gnh_version", std::string(version()));
    h5::write_attr(root, "git_commit", std::string(git_commit()));
    h5::write_attr(root, "build", build_configuration());
    h5::write_attr(root, "deck", info.deck_text);
    h5::write_attr(root, "deck_effective", info.effective_deck);
    h5::write_attr(root, "settings_fingerprint", info.settings_fingerprint);
    h5::write_attr(root, "model_config", info.model_config);
    h5::write_attr(root, "run_name", info.run_name);
    h5::write_attr(root, "ranks", std::int64_t(info.ranks));
    h5::Handle all = h5::create_group(root, "groups", tmp);
    for (const auto& g : groups) {
      if (!g.error.empty()) continue;
      h5::Handle gg = h5::create_group(all.id(), g.hash, tmp);
      h5::write_attr(gg.id(), "aliases", g.aliases);
      h5::write_attr(gg.id(), "alias_paths", g.alias_paths);
      h5::write_attr(gg.id(), "param_sha256", g.param_sha256);
      h5::write_attr(gg.id(), "n_params", g.n_params);
      if (g.iter_num) h5::write_attr(gg.id(), "iter_num", *g.iter_num);
      h5::write_attr(gg.id(), "workspace_bytes", g.workspace_bytes);
      for (const auto& c : g.cases) {
        if (!c.error.empty()) continue;
        h5::Handle cg = h5::create_group(gg.id(), c.name, tmp);
        h5::write_attr(cg.id(), "loss", c.loss);
        h5::write_attr(cg.id(), "tokens", c.tokens);
        h5::write_attr(cg.id(), "blocks", c.blocks);
        h5::write_attr(cg.id(), "time_loss_s", c.seconds);
      }
    }
    f.close();
  }
  fsync_path(tmp);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    fail(path, ": cannot rename ", tmp, " into place");
  }
}

}  // namespace gnh
