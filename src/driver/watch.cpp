// SPDX-License-Identifier: BSD-3-Clause
#include "driver/watch.hpp"

#include <CLI/CLI.hpp>
#include <memory>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "core/error.hpp"
#include "driver/merge.hpp"
#include "driver/report.hpp"
#include "driver/shell.hpp"
#include "io/files.hpp"
#include "io/hdf5.hpp"
#include "io/results.hpp"

namespace gnh {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

// Slurm's state of a job: squeue (which keeps finished jobs for MinJobAge),
// then sacct (accounting), else UNKNOWN (gone from both).
std::string slurm_state(const std::string& job, std::string* reason = nullptr) {
  int st = 0;
  std::string s = run_capture("squeue -h -t all -j " + shell_quote(job) + " -o '%T|%r' 2>/dev/null", st);
  if (st == 0 && !s.empty()) {
    s = s.substr(0, s.find('\n'));
    if (reason) *reason = s.substr(s.find('|') + 1);
    return s.substr(0, s.find('|'));
  }
  s = run_capture("sacct -n -X -P -j " + shell_quote(job) + " -o State 2>/dev/null", st);
  if (st == 0 && !s.empty()) {
    s = s.substr(0, s.find('\n'));
    return s.substr(0, s.find(' '));  // "CANCELLED by 0"
  }
  return "UNKNOWN";
}

bool active(const std::string& state) {
  static const std::set<std::string> a = {"PENDING",   "RUNNING",      "CONFIGURING", "COMPLETING",
                                          "REQUEUED",  "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING",
                                          "SUSPENDED", "STOPPED",      "SIGNALING",   "STAGE_OUT"};
  return a.count(state) > 0;
}

// A results file (a shard's or the merge's) that a run of these settings finished.
bool results_complete(const std::string& path, const std::string& fingerprint) {
  if (!fs::exists(path)) return false;
  try {
    h5::File f = h5::File::open_read(path);
    return h5::read_string_attr(f.id(), "settings_fingerprint", path).value_or("") == fingerprint &&
           h5::read_int_attr(f.id(), "complete", path).value_or(0) == 1;
  } catch (const Error&) {
    return false;
  }
}

class Watcher {
 public:
  Watcher(const Comm& comm, const WatchOptions& opt) : comm_(comm), opt_(opt) {
    log_path_ = (fs::path(opt.receipt).parent_path() / "watch.log").string();
  }

  void log(const std::string& line) {
    std::printf("gnh watch: %s\n", line.c_str());
    std::fflush(stdout);
    append_file(log_path_, utc_now() + " " + line + "\n");
  }

  json load() {
    std::ifstream in(opt_.receipt);
    if (!in) fail(opt_.receipt, ": cannot open the receipt (gnh plan writes OUTPUT.plan/receipt.json)");
    try {
      json r = json::parse(in);
      if (!r.contains("shards") || !r.contains("merge") || !r.contains("settings_fingerprint"))
        fail(opt_.receipt, ": not a gnh plan receipt (no shards, merge or settings_fingerprint)");
      return r;
    } catch (const json::exception& e) {
      fail(opt_.receipt, ": not a valid receipt (", e.what(), ")");
    }
  }

  void save(const json& r) { write_file_atomically(opt_.receipt, r.dump(2) + "\n"); }

  // The shard's jobs, oldest first: the plan's submission, then the watcher's.
  static std::vector<std::string> jobs_of(const json& shard) {
    std::vector<std::string> jobs;
    if (shard.contains("job_id")) jobs.push_back(shard["job_id"].get<std::string>());
    if (shard.contains("attempts"))
      for (const auto& a : shard["attempts"]) jobs.push_back(a["job_id"].get<std::string>());
    return jobs;
  }

  std::string submit(const std::string& script) {
    int st = 0;
    const std::string id = run_capture("sbatch --parsable " + shell_quote(script) + " 2>&1", st);
    if (st != 0) fail("sbatch ", script, " failed: ", id);
    return id.substr(0, id.find(';'));
  }

  // What one look found across the shards.
  struct Look {
    bool all_done = true, changed = false, resubmitted_any = false;
    bool stuck = false;  // a shard failed and will not be resubmitted
    std::vector<std::string> outputs;
  };

  // One shard: its line, and, where it ended without a complete output, a
  // resubmission (with --resubmit, within --max-attempts) or a stuck note.
  void look_at_shard(json& shard, const std::string& fp, Look& look) {
    const int index = shard["index"].get<int>();
    const std::string output = shard["output"].get<std::string>();
    look.outputs.push_back(output);
    const auto& groups = shard["groups"];
    int done = 0;
    for (const auto& g : groups)
      if (group_file_complete(group_file(output, g.get<std::string>()), fp)) ++done;
    const std::vector<std::string> jobs = jobs_of(shard);
    if (jobs.size() > 1) look.resubmitted_any = true;
    const std::string job = jobs.empty() ? "" : jobs.back();
    const std::string state = job.empty() ? "NOT_SUBMITTED" : slurm_state(job);
    const bool complete = results_complete(output, fp);
    char eta[64] = "";
    if (!complete && shard.contains("estimate_seconds") && !groups.empty())
      std::snprintf(
          eta, sizeof(eta), ", ~%.0f s left by the plan's estimate",
          shard["estimate_seconds"].get<double>() * double(int(groups.size()) - done) / double(groups.size()));
    std::printf("  shard %d: job %s %s, groups %d/%zu, attempts %zu%s%s\n", index, job.empty() ? "-" : job.c_str(),
                state.c_str(), done, groups.size(), jobs.size(), complete ? ", complete" : "", eta);
    if (complete) return;
    look.all_done = false;
    if (active(state)) return;
    // Finished without a complete output, cancelled, timed out, gone, or never submitted.
    if (!opt_.resubmit) {
      log("shard " + std::to_string(index) + " (job " + (job.empty() ? "-" : job) + ") is " + state +
          " without a complete output; resubmit it with gnh watch --resubmit");
      look.stuck = true;
      return;
    }
    if (int(jobs.size()) >= opt_.max_attempts) {
      log("shard " + std::to_string(index) + " is " + state + " after " + std::to_string(jobs.size()) +
          " attempt(s), the most allowed (--max-attempts); see its log " + shard["script"].get<std::string>());
      look.stuck = true;
      return;
    }
    const std::string id = submit(shard["script"].get<std::string>());
    shard["attempts"].push_back({{"job_id", id}, {"submitted", utc_now()}, {"replaces", job}, {"reason", state}});
    log("shard " + std::to_string(index) + ": job " + (job.empty() ? "-" : job) + " " + state +
        "; resubmitted as job " + id + " (attempt " + std::to_string(jobs.size() + 1) + ")");
    look.changed = true;
    look.resubmitted_any = true;
  }

  // The plan's merge job waits on the first submissions (afterok): after a
  // resubmission it can never run. Cancel it; the watcher merges instead.
  void cancel_orphaned_merge(json& r) {
    const std::string merge_job = r["merge"].value("job_id", "");
    if (merge_job.empty()) return;
    std::string reason;
    const std::string ms = slurm_state(merge_job, &reason);
    if (!active(ms) || r["merge"].contains("cancelled_by_watch")) return;
    int st = 0;
    run_capture("scancel " + shell_quote(merge_job) + " 2>&1", st);
    r["merge"]["cancelled_by_watch"] = utc_now();
    save(r);
    log("merge job " + merge_job + " (" + ms + ", " + reason +
        ") waits on a failed submission and cannot run; cancelled, gnh watch merges instead");
  }

  // Every shard is complete: true once merged and reported, by the plan's
  // merge job or here.
  bool merge_complete_campaign(json& r, const std::string& fp, const Look& look) {
    const std::string merged = r["merge"]["output"].get<std::string>();
    const std::string report = r["merge"]["report"].get<std::string>();
    if (results_complete(merged, fp) && fs::exists(fs::path(report) / "manifest.json")) {
      std::printf("  merge: complete, %s (report %s)\n", merged.c_str(), report.c_str());
      return true;
    }
    const std::string merge_job = r["merge"].value("job_id", "");
    if (!merge_job.empty() && !look.resubmitted_any) {
      const std::string ms = slurm_state(merge_job);
      if (active(ms)) {
        std::printf("  merge: job %s %s\n", merge_job.c_str(), ms.c_str());
        return false;  // it will merge
      }
    }
    log("every shard is complete; merging into " + merged);
    MergeOptions m;
    m.output = merged;
    m.shards = look.outputs;
    if (merge_command(comm_, m) != 0) fail("gnh merge ", merged, " failed (see above)");
    if (report_command(comm_, merged, report) != 0) fail("gnh report ", merged, " failed (see above)");
    r = load();
    r["merge"]["merged_by_watch"] = utc_now();
    save(r);
    log("merged " + merged + " and drew the report in " + report);
    return true;
  }

  // One look at every shard and the merge; true when the campaign is merged.
  // `stuck` is set when a shard failed and will not be resubmitted.
  bool look(bool& stuck) {
    json r = load();
    const std::string fp = r["settings_fingerprint"].get<std::string>();
    Look look;
    for (auto& shard : r["shards"]) look_at_shard(shard, fp, look);
    stuck = look.stuck;
    if (look.changed) save(r);
    if (!look.all_done) {
      if (look.resubmitted_any) cancel_orphaned_merge(r);
      return false;
    }
    return merge_complete_campaign(r, fp, look);
  }

  int run() {
    for (;;) {
      std::printf("gnh watch: %s at %s\n", opt_.receipt.c_str(), utc_now().c_str());
      bool stuck = false;
      if (look(stuck)) return 0;
      if (stuck) return 1;
      if (!opt_.follow) return 0;
      std::this_thread::sleep_for(std::chrono::duration<double>(opt_.interval));
    }
  }

 private:
  const Comm& comm_;
  const WatchOptions& opt_;
  std::string log_path_;
};

}  // namespace

int watch_command(const Comm& comm, const WatchOptions& opt) {
  if (comm.size() != 1) fail("gnh watch runs as one process (not under mpirun or srun with several ranks)");
  if (opt.max_attempts < 1) fail("--max-attempts must be at least 1");
  if (!(opt.interval > 0)) fail("--interval must be positive");
  return Watcher(comm, opt).run();
}

Subcommand add_watch_command(CLI::App& gnh) {
  auto opt = std::make_shared<WatchOptions>();
  CLI::App* cmd = gnh.add_subcommand(
      "watch",
      "Follow a planned campaign from its receipt (OUTPUT.plan/receipt.json): every shard's Slurm state, "
      "groups done and attempts; --resubmit resubmits failed, cancelled or timed-out shards; once every "
      "shard is complete, merges and draws the report. One look by default; actions go to watch.log "
      "beside the receipt");
  cmd->add_option("receipt", opt->receipt, "The plan's receipt.json")->required();
  cmd->add_flag("--resubmit", opt->resubmit, "Resubmit shards that failed, were cancelled or timed out");
  cmd->add_option("--max-attempts", opt->max_attempts, "Submissions per shard, the first included")
      ->capture_default_str();
  cmd->add_flag("--follow", opt->follow, "Keep watching until the campaign is merged or a shard is stuck");
  cmd->add_option("--interval", opt->interval, "Seconds between looks with --follow")->capture_default_str();
  return {cmd, [opt](const Comm& comm) { return watch_command(comm, *opt); }};
}

}  // namespace gnh
