// SPDX-License-Identifier: BSD-3-Clause
#include "io/deck.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <type_traits>

#include "core/error.hpp"

namespace gnh {
namespace {

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string suggestion(const std::string& key, const std::vector<std::string>& known) {
  std::string best;
  std::size_t best_d = 3;  // suggest only close misspellings
  for (const auto& k : known) {
    const std::size_t d = edit_distance(key, k);
    if (d < best_d) {
      best_d = d;
      best = k;
    }
  }
  return best.empty() ? "" : " (did you mean '" + best + "'?)";
}

std::string type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::table:
      return "a table";
    default:
      return "a date/time";
  }
}

// Walks the parsed table, remembering which dotted keys came from --set.
class Reader {
 public:
  Reader(std::string file, std::map<std::string, std::string> origin)
      : file_(std::move(file)), origin_(std::move(origin)) {}

  std::string where(const toml::node& n, const std::string& key) const {
    auto it = origin_.find(key);
    if (it != origin_.end()) return "--set " + it->second;
    // An override of a parent (e.g. --set data.seen={...}) owns its children.
    for (const auto& [k, v] : origin_)
      if (key.rfind(k + ".", 0) == 0) return "--set " + v;
    const auto line = n.source().begin.line;
    return line > 0 ? file_ + ":" + std::to_string(line) : file_;
  }

  void check_keys(const toml::table& t, const std::string& section, const std::vector<std::string>& known) const {
    for (const auto& [k, node] : t) {
      const std::string key(k.str());
      if (std::find(known.begin(), known.end(), key) == known.end()) {
        const std::string dotted = section.empty() ? key : section + "." + key;
        fail(where(node, dotted), ": unknown key '", dotted, "'", suggestion(key, known));
      }
    }
  }

  const toml::table* section(const toml::table& root, const std::string& name, bool required) const {
    const toml::node* n = root.get(name);
    if (!n) {
      if (required) fail(file_, ": missing required section [", name, "]");
      return nullptr;
    }
    if (!n->is_table()) fail(where(*n, name), ": '", name, "' must be a table ([", name, "])");
    return n->as_table();
  }

  std::string str(const toml::table& t, const std::string& sec, const std::string& key, std::string dflt,
                  bool required = false, const std::vector<std::string>& allowed = {}) const {
    const std::string dotted = sec + "." + key;
    const toml::node* n = t.get(key);
    if (!n) {
      if (required) fail(file_, ": missing required key ", dotted);
      return dflt;
    }
    if (!n->is_string()) fail(where(*n, dotted), ": ", dotted, " must be a string, got ", type_name(*n));
    std::string v = n->as_string()->get();
    if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), v) == allowed.end()) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "\"" : ", \"") + a + "\"";
      fail(where(*n, dotted), ": ", dotted, " = \"", v, "\" is not one of ", list);
    }
    if (required && v.empty()) fail(where(*n, dotted), ": ", dotted, " must not be empty");
    return v;
  }

  std::int64_t integer(const toml::table& t, const std::string& sec, const std::string& key, std::int64_t dflt,
                       std::int64_t lo, std::int64_t hi, bool required = false) const {
    const std::string dotted = sec + "." + key;
    const toml::node* n = t.get(key);
    if (!n) {
      if (required) fail(file_, ": missing required key ", dotted);
      return dflt;
    }
    if (!n->is_integer()) fail(where(*n, dotted), ": ", dotted, " must be an integer, got ", type_name(*n));
    const std::int64_t v = n->as_integer()->get();
    if (v < lo || v > hi) fail(where(*n, dotted), ": ", dotted, " = ", v, " is out of range (", lo, " .. ", hi, ")");
    return v;
  }

  // A number (an integer is taken as one), within [lo, hi].
  double real(const toml::table& t, const std::string& sec, const std::string& key, double dflt, double lo,
              double hi) const {
    const std::string dotted = sec + "." + key;
    const toml::node* n = t.get(key);
    if (!n) return dflt;
    if (!n->is_number()) fail(where(*n, dotted), ": ", dotted, " must be a number, got ", type_name(*n));
    const double v = n->is_integer() ? double(n->as_integer()->get()) : n->as_floating_point()->get();
    if (!(v >= lo && v <= hi))
      fail(where(*n, dotted), ": ", dotted, " = ", v, " is out of range (", lo, " .. ", hi, ")");
    return v;
  }

  bool boolean(const toml::table& t, const std::string& sec, const std::string& key, bool dflt) const {
    const std::string dotted = sec + "." + key;
    const toml::node* n = t.get(key);
    if (!n) return dflt;
    if (!n->is_boolean()) fail(where(*n, dotted), ": ", dotted, " must be true or false, got ", type_name(*n));
    return n->as_boolean()->get();
  }

  std::vector<std::string> strings(const toml::table& t, const std::string& sec, const std::string& key) const {
    const std::string dotted = sec + "." + key;
    const toml::node* n = t.get(key);
    if (!n) fail(file_, ": missing required key ", dotted);
    std::vector<std::string> out;
    if (n->is_string()) {
      out.push_back(n->as_string()->get());
    } else if (n->is_array()) {
      for (const auto& e : *n->as_array()) {
        if (!e.is_string()) fail(where(*n, dotted), ": ", dotted, " must be an array of strings, found ", type_name(e));
        out.push_back(e.as_string()->get());
      }
    } else {
      fail(where(*n, dotted), ": ", dotted, " must be an array of strings, got ", type_name(*n));
    }
    if (out.empty()) fail(where(*n, dotted), ": ", dotted, " is empty");
    return out;
  }

  const std::string& file() const { return file_; }

 private:
  std::string file_;
  std::map<std::string, std::string> origin_;
};

// A value that TOML cannot parse is taken as a string only when it is a bare
// word (fp32, bf16-amp, runs/x.h5): anything with TOML's brackets, braces or
// quotes was meant as TOML and is an error.
bool bare_word(const std::string& v) {
  return !v.empty() && v.find_first_of("[]{}\"'=,#") == std::string::npos && v.find_first_not_of(" \t") == 0;
}

// Applies one --set override to the table; returns the dotted key. Tables it
// creates are recorded in origin, so an error about them blames the --set.
std::string apply_override(toml::table& root, const std::string& spec, std::map<std::string, std::string>& origin) {
  const auto eq = spec.find('=');
  if (eq == std::string::npos || eq == 0) fail("--set ", spec, ": expected key=value (e.g. analysis.directions=8)");
  const std::string key = spec.substr(0, eq), value = spec.substr(eq + 1);
  std::vector<std::string> parts;
  std::stringstream ks(key);
  for (std::string p; std::getline(ks, p, '.');) {
    if (p.empty()) fail("--set ", spec, ": malformed key '", key, "'");
    parts.push_back(p);
  }
  if (parts.size() < 2) fail("--set ", spec, ": key must be section.key (e.g. analysis.seed)");
  toml::table* t = &root;
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    toml::node* n = t->get(parts[i]);
    if (!n) {
      t->insert(parts[i], toml::table{});
      n = t->get(parts[i]);
      std::string prefix;
      for (std::size_t j = 0; j <= i; ++j) prefix += (j ? "." : "") + parts[j];
      origin.emplace(prefix, spec);
    }
    if (!n->is_table()) fail("--set ", spec, ": '", parts[i], "' is not a table");
    t = n->as_table();
  }
  try {
    toml::table parsed = toml::parse("v = " + value);
    t->insert_or_assign(parts.back(), *parsed.get("v"));
  } catch (const toml::parse_error& e) {
    if (!bare_word(value))
      fail("--set ", spec, ": value '", value, "' is not valid TOML (", e.description(), "); quote a string, e.g. ",
           key, "='\"...\"'");
    t->insert_or_assign(parts.back(), value);  // a bare word: take it as a string
  }
  origin[key] = spec;
  return key;
}

}  // namespace

std::string Deck::resolve(const std::string& p) const {
  if (p.empty() || p[0] == '/' || dir.empty()) return p;
  return (std::filesystem::path(dir) / p).lexically_normal().string();
}

namespace {

// [run]: the output is required; the name defaults to the deck file's stem.
void read_run_section(const Reader& r, const toml::table& root, Deck& d) {
  const toml::table* run = r.section(root, "run", true);
  if (!run) return;
  r.check_keys(*run, "run", {"name", "output", "strict_kernels"});
  d.output = r.str(*run, "run", "output", "", true);
  d.strict_kernels = r.boolean(*run, "run", "strict_kernels", false);
  std::string stem = d.file.substr(d.file.find_last_of('/') + 1);
  stem = stem.substr(0, stem.find_last_of('.'));
  d.name = r.str(*run, "run", "name", stem);
}

// [checkpoints] key = { "file-glob" = value, ... }: each entry to take(glob,
// value, dotted key); anything but a table refused with an example.
template <class Take>
void glob_table(const Reader& r, const toml::table& ck, const std::string& key, const char* example, Take&& take) {
  const toml::node* n = ck.get(key);
  if (!n) return;
  const std::string dotted = "checkpoints." + key;
  if (!n->is_table())
    fail(r.where(*n, dotted), ": ", dotted, " must be a table of file-name globs and values, like ", example);
  for (const auto& [k, v] : *n->as_table()) take(std::string(k.str()), v, dotted + "." + std::string(k.str()));
}

void read_checkpoints_section(const Reader& r, const toml::table& root, Deck& d) {
  const toml::table* ck = r.section(root, "checkpoints", true);
  if (!ck) return;
  r.check_keys(*ck, "checkpoints", {"paths", "steps", "learning_rates"});
  d.checkpoint_paths = r.strings(*ck, "checkpoints", "paths");
  glob_table(r, *ck, "steps", "{ \"step1000*\" = 1000 }",
             [&](const std::string& glob, const toml::node& v, const std::string& key) {
               if (!v.is_integer() || v.as_integer()->get() < 0)
                 fail(r.where(v, key), ": ", key, " must be a training step (an integer >= 0)");
               d.checkpoint_steps.emplace_back(glob, v.as_integer()->get());
             });
  glob_table(r, *ck, "learning_rates", "{ \"ckpt_*\" = 6e-4 }",
             [&](const std::string& glob, const toml::node& v, const std::string& key) {
               const double x = v.is_integer()          ? double(v.as_integer()->get())
                                : v.is_floating_point() ? v.as_floating_point()->get()
                                                        : -1.0;
               if (!(x > 0 && std::isfinite(x)))
                 fail(r.where(v, key), ": ", key, " must be a learning rate (a number > 0)");
               d.checkpoint_learning_rates.emplace_back(glob, x);
             });
}

// samples = [first, end), or steps_before = W with batch_samples = B.
void read_sample_selection(const Reader& r, const toml::table& t, const std::string& sec, DataCaseSpec& cs) {
  if (const toml::node* n = t.get("samples")) {
    const std::string key = sec + ".samples";
    const toml::array* a = n->as_array();
    if (!a || a->size() != 2 || !(*a)[0].is_integer() || !(*a)[1].is_integer())
      fail(r.where(*n, key), ": ", key, " must be [first, end], two integers (samples first .. end - 1)");
    cs.samples_first = (*a)[0].as_integer()->get();
    cs.samples_end = (*a)[1].as_integer()->get();
    if (cs.samples_first < 0 || cs.samples_end <= cs.samples_first)
      fail(r.where(*n, key), ": ", key, " = [", cs.samples_first, ", ", cs.samples_end,
           "] is empty or negative (need 0 <= first < end)");
  }
  cs.steps_before = r.integer(t, sec, "steps_before", 0, 1, std::int64_t(1) << 40);
  cs.batch_samples = r.integer(t, sec, "batch_samples", 0, 1, std::int64_t(1) << 30);
  const toml::node* sb = t.get("steps_before");
  const toml::node* bs = t.get("batch_samples");
  if (sb && !bs)
    fail(r.where(*sb, sec + ".steps_before"), ": ", sec,
         ".steps_before needs batch_samples (samples per training "
         "step, 1024 for Pythia)");
  if (bs && !sb)
    fail(r.where(*bs, sec + ".batch_samples"), ": ", sec,
         ".batch_samples goes with steps_before (the training steps "
         "before each checkpoint)");
  if (sb && t.get("samples"))
    fail(r.where(*sb, sec + ".steps_before"), ": ", sec, ".steps_before and ", sec,
         ".samples both choose the samples: give one");
}

// data.seen or data.unseen: a table like { path = "...", dtype = "uint16" }.
DataCaseSpec read_data_case(const Reader& r, const toml::node& n, const char* c) {
  const std::string sec = std::string("data.") + c;
  if (!n.is_table()) fail(r.where(n, sec), ": ", sec, " must be a table like { path = \"...\", dtype = \"uint16\" }");
  const toml::table& t = *n.as_table();
  r.check_keys(
      t, sec,
      {"path", "format", "dtype", "dataset", "layout", "sequence_length", "samples", "steps_before", "batch_samples"});
  DataCaseSpec cs;
  cs.name = c;
  cs.path = r.str(t, sec, "path", "", true);
  cs.layout = r.str(t, sec, "layout", "stream", false, {"stream", "sequences"});
  cs.sequence_length = r.integer(t, sec, "sequence_length", 0, 2, std::int64_t(1) << 30);
  if (cs.layout == "sequences" && !t.get("sequence_length"))
    fail(r.where(t, sec), ": ", sec, " has layout \"sequences\" but no sequence_length (tokens per sample)");
  if (cs.layout == "stream" && t.get("sequence_length"))
    fail(r.where(*t.get("sequence_length"), sec + ".sequence_length"), ": ", sec,
         ".sequence_length needs layout = \"sequences\" (a stream's blocks overlap by one token)");
  read_sample_selection(r, t, sec, cs);
  cs.dtype = r.str(t, sec, "dtype", "uint16", false, {"uint16", "uint32", "hdf5"});
  cs.dataset = r.str(t, sec, "dataset", "");
  cs.format = r.str(t, sec, "format", cs.dtype == "hdf5" ? "hdf5" : "bin", false, {"bin", "hdf5", "megatron", "npy"});
  if (cs.format == "megatron" || cs.format == "npy") {
    // Their files say what their ids are.
    for (const char* key : {"dtype", "dataset"})
      if (const toml::node* k = t.get(key))
        fail(r.where(*k, sec + "." + key), ": ", sec, ".", key, " does not go with format \"", cs.format,
             "\" (the file gives its own dtype)");
    return cs;
  }
  if (cs.format == "bin" && cs.dtype == "hdf5")
    fail(r.where(*t.get("dtype"), sec + ".dtype"), ": ", sec, ".dtype = \"hdf5\" does not go with format \"bin\"");
  if (cs.format == "hdf5") cs.dtype = "hdf5";
  if (cs.dtype == "hdf5" && cs.dataset.empty()) fail(r.where(t, sec), ": ", sec, " has dtype \"hdf5\" but no dataset");
  if (cs.dtype != "hdf5" && !cs.dataset.empty())
    fail(r.where(*t.get("dataset"), sec + ".dataset"), ": ", sec, ".dataset = \"", cs.dataset,
         "\" needs dtype = \"hdf5\" (dtype \"", cs.dtype, "\" is a flat binary token file)");
  return cs;
}

void read_data_section(const Reader& r, const toml::table& root, Deck& d) {
  const toml::table* data = r.section(root, "data", true);
  if (!data) return;
  r.check_keys(*data, "data", {"context", "max_blocks", "seen", "unseen"});
  d.analysis.context = r.integer(*data, "data", "context", 0, 1, 1 << 20, true);
  d.max_blocks = r.integer(*data, "data", "max_blocks", 0, 0, INT64_MAX);
  for (const char* c : {"seen", "unseen"})
    if (const toml::node* n = data->get(c)) {
      d.cases.push_back(read_data_case(r, *n, c));
      const DataCaseSpec& cs = d.cases.back();
      if (cs.layout == "sequences" && cs.sequence_length < d.analysis.context + 1)
        fail(r.where(*n->as_table()->get("sequence_length"), std::string("data.") + c + ".sequence_length"), ": data.",
             c, ".sequence_length = ", cs.sequence_length, " is shorter than a block: context ", d.analysis.context,
             " needs ", d.analysis.context + 1, " tokens a sample (the inputs and the last target)");
    }
  if (d.cases.empty()) fail(r.where(*data, "data"), ": [data] needs at least one of seen, unseen");
}

// [analysis]: every key of analysis/settings.hpp, by its declared range.
void read_analysis_section(const Reader& r, const toml::table& root, Deck& d) {
  const toml::table* a = r.section(root, "analysis", false);
  if (!a) return;
  std::vector<std::string> known;
  for_each_analysis_key(d.analysis, [&](const AnalysisKey& k, const auto&) { known.push_back(k.name); });
  r.check_keys(*a, "analysis", known);
  for_each_analysis_key(d.analysis, [&](const AnalysisKey& k, auto& v) {
    using V = std::decay_t<decltype(v)>;
    if constexpr (std::is_same_v<V, CurvatureMethod>)
      v = *curvature_method_named(r.str(*a, "analysis", k.name, to_string(v), false, curvature_method_names()));
    else if constexpr (std::is_same_v<V, bool>) v = r.boolean(*a, "analysis", k.name, v);
    else v = static_cast<V>(r.integer(*a, "analysis", k.name, static_cast<std::int64_t>(v), k.lowest, k.highest));
  });
}

void read_precision_section(const Reader& r, const toml::table& root, Deck& d) {
  const toml::table* p = r.section(root, "precision", false);
  if (!p) return;
  r.check_keys(*p, "precision", {"policy"});
  d.analysis.precision =
      *precision_named(r.str(*p, "precision", "policy", to_string(d.analysis.precision), false, precision_names()));
}

// curvature.trace_estimator: "both" by default where the curvature passes
// keep products (forward-over-reverse) and there are directions enough for
// a sketch, its products and a complement (3); asked for elsewhere, refused.
void read_trace_estimator(const Reader& r, const toml::table& c, Deck& d) {
  CurvatureSettings& cv = d.analysis.curvature;
  const bool allow = d.analysis.curvature_method == CurvatureMethod::forward_over_reverse && d.analysis.directions >= 3;
  cv.trace_estimator =
      r.str(c, "curvature", "trace_estimator", allow ? "both" : "hutchinson", false, {"hutchinson", "hutch++", "both"});
  cv.hutchpp = cv.trace_estimator != "hutchinson";
  if (cv.hutchpp && !allow)
    fail(r.where(*c.get("trace_estimator"), "curvature.trace_estimator"), ": curvature.trace_estimator = \"",
         cv.trace_estimator,
         "\" applies the Hessian to a sketch of the directions: it needs "
         "analysis.curvature_method = \"forward-over-reverse\" and analysis.directions >= 3 (now ",
         to_string(d.analysis.curvature_method), ", ", d.analysis.directions, ")");
}

void read_curvature_section(const Reader& r, const toml::table& root, Deck& d) {
  const toml::table* c = r.section(root, "curvature", false);
  if (!c) return;
  r.check_keys(
      *c, "curvature",
      {"blocks", "diagonal", "update", "preconditioned", "lanczos_steps", "lanczos_chains", "lanczos_operator",
       "top_eigenvalues", "lanczos_tolerance", "operator", "eigenvectors", "spectrum_blocks", "trace_estimator"});
  d.analysis.curvature.blocks = r.boolean(*c, "curvature", "blocks", false);
  d.analysis.curvature.diagonal = r.boolean(*c, "curvature", "diagonal", false);
  d.analysis.curvature.preconditioned = r.boolean(*c, "curvature", "preconditioned", false);
  d.analysis.curvature.update = r.boolean(*c, "curvature", "update", false);
  CurvatureSettings& cv = d.analysis.curvature;
  cv.lanczos_steps = r.integer(*c, "curvature", "lanczos_steps", 0, 0, 1 << 20);
  cv.lanczos_chains = r.integer(*c, "curvature", "lanczos_chains", 4, 1, 4096);
  cv.top_eigenvalues = r.integer(*c, "curvature", "top_eigenvalues", 5, 1, 1 << 20);
  cv.lanczos_php = r.str(*c, "curvature", "lanczos_operator", "H", false, {"H", "PHP"}) == "PHP";
  cv.lanczos_tolerance = r.real(*c, "curvature", "lanczos_tolerance", 0.0, 0.0, 1.0);
  cv.eigenvectors = r.integer(*c, "curvature", "eigenvectors", 0, 0, 1 << 20);
  cv.layer_spectra = r.str(*c, "curvature", "spectrum_blocks", "none", false, {"none", "layer"}) == "layer";
  if (cv.layer_spectra && cv.lanczos_steps == 0)
    fail(r.where(*c->get("spectrum_blocks"), "curvature.spectrum_blocks"),
         ": curvature.spectrum_blocks = \"layer\" runs the spectrum's Lanczos steps on every layer block: set "
         "curvature.lanczos_steps");
  if (cv.eigenvectors > 0 && cv.lanczos_steps == 0)
    fail(r.where(*c->get("eigenvectors"), "curvature.eigenvectors"),
         ": curvature.eigenvectors > 0 takes the Ritz vectors of the spectrum's first Lanczos chain: set "
         "curvature.lanczos_steps (at least the number of vectors)");
  if (cv.eigenvectors > cv.lanczos_steps && cv.lanczos_steps > 0)
    fail(r.where(*c->get("eigenvectors"), "curvature.eigenvectors"), ": curvature.eigenvectors = ", cv.eigenvectors,
         " is more than the Ritz vectors of a chain of curvature.lanczos_steps = ", cv.lanczos_steps, " steps");
  read_trace_estimator(r, *c, d);
  const std::string op = r.str(*c, "curvature", "operator", "hessian", false, {"hessian", "ggn", "both"});
  cv.op = op == "ggn" ? OperatorChoice::ggn : op == "both" ? OperatorChoice::both : OperatorChoice::hessian;
  // With "ggn" the products behind the per-block values and the diagonal
  // would be the Gauss-Newton operator's; they are the Hessian's (with
  // "both"), the curvature passes forming H v alone. The spectrum follows the
  // operator.
  if (cv.op == OperatorChoice::ggn && (cv.blocks || cv.diagonal))
    fail(r.where(*c->get("operator"), "curvature.operator"),
         ": curvature.operator = \"ggn\" gives the Gauss-Newton scalars and spectrum; the per-block values and "
         "the diagonal (curvature.blocks, diagonal) are the Hessian's: set curvature.operator = \"both\" for them "
         "beside the Gauss-Newton statistics");
  // Lanczos needs the epoch's H v, which only forward-over-reverse forms.
  if (cv.lanczos_steps > 0 && d.analysis.curvature_method != CurvatureMethod::forward_over_reverse)
    fail(r.where(*c->get("lanczos_steps"), "curvature.lanczos_steps"),
         ": curvature.lanczos_steps > 0 (the spectrum) needs the epoch's Hessian-vector products: set "
         "analysis.curvature_method = \"forward-over-reverse\" (it is \"",
         to_string(d.analysis.curvature_method), "\")");
}

// One [landscape] direction list (SPEC §13), each name checked against what
// the run computes: the update needs curvature.update, eigenvector:i the
// Hessian's first i Ritz vectors.
std::vector<LandscapeDirection> landscape_directions(const Reader& r, const toml::table& l, const std::string& key,
                                                     const Deck& d) {
  const std::string dotted = "landscape." + key;
  const toml::node& n = *l.get(key);
  const CurvatureSettings& cv = d.analysis.curvature;
  std::vector<LandscapeDirection> out;
  for (const std::string& name : r.strings(l, "landscape", key)) {
    const auto dir = landscape_direction_named(name);
    if (!dir)
      fail(r.where(n, dotted), ": ", dotted, ": \"", name,
           "\" is not a direction: \"gradient\", \"update\", \"eigenvector:i\" or \"random:j\" (i, j from 1)");
    if (std::find(out.begin(), out.end(), *dir) != out.end())
      fail(r.where(n, dotted), ": ", dotted, " names \"", name, "\" twice");
    if (dir->kind == LandscapeKind::update && !cv.update)
      fail(r.where(n, dotted), ": ", dotted,
           ": \"update\" is the update to the next state: set curvature.update = true");
    if (dir->kind == LandscapeKind::eigenvector) {
      if (cv.eigenvectors < dir->index)
        fail(r.where(n, dotted), ": ", dotted, ": \"", name, "\" needs the top ", dir->index,
             " Ritz vectors: set curvature.eigenvectors to at least ", dir->index);
      if (cv.lanczos_php || cv.op == OperatorChoice::ggn)
        fail(r.where(n, dotted), ": ", dotted, ": \"", name,
             "\" takes the Hessian's Ritz vectors: curvature.lanczos_operator = \"H\" and curvature.operator "
             "\"hessian\" or \"both\"");
    }
    out.push_back(*dir);
  }
  return out;
}

void read_landscape_section(const Reader& r, const toml::table& root, Deck& d) {
  const toml::table* l = r.section(root, "landscape", false);
  if (!l) return;
  r.check_keys(*l, "landscape", {"directions", "points", "range", "plane", "plane_points", "seed"});
  LandscapeSettings& ls = d.analysis.landscape;
  if (l->get("directions")) ls.directions = landscape_directions(r, *l, "directions", d);
  if (l->get("plane")) {
    ls.plane = landscape_directions(r, *l, "plane", d);
    if (ls.plane.size() != 2)
      fail(r.where(*l->get("plane"), "landscape.plane"), ": landscape.plane names ", ls.plane.size(),
           " directions: a plane takes two");
  }
  if (!ls.any()) fail(r.file(), ": [landscape] names no direction: set landscape.directions or landscape.plane");
  ls.points = r.integer(*l, "landscape", "points", 21, 3, 10001);
  ls.plane_points = r.integer(*l, "landscape", "plane_points", 11, 3, 1001);
  for (const auto& [key, v] : {std::pair<const char*, index_t>{"points", ls.points}, {"plane_points", ls.plane_points}})
    if (v % 2 == 0)
      fail(r.where(*l->get(key), std::string("landscape.") + key), ": landscape.", key, " = ", v,
           " is even: the grid is symmetric about alpha = 0, which is one of its points");
  ls.range = r.real(*l, "landscape", "range", 1.0, 1e-12, 1e12);
  ls.seed = std::uint64_t(r.integer(*l, "landscape", "seed", std::int64_t(d.analysis.seed), 0, INT64_MAX));
}

void read_parallel_section(const Reader& r, const toml::table& root, Deck& d) {
  const toml::table* p = r.section(root, "parallel", false);
  if (!p) return;
  r.check_keys(*p, "parallel", {"ranks_per_checkpoint", "noise_vectors", "parameter_shards"});
  d.ranks_per_checkpoint = r.integer(*p, "parallel", "ranks_per_checkpoint", 1, 1, 1 << 20);
  d.analysis.parameter_shards = r.integer(*p, "parallel", "parameter_shards", 1, 1, 1 << 20);
  if (d.ranks_per_checkpoint % d.analysis.parameter_shards != 0)
    fail(r.where(*p->get("parameter_shards"), "parallel.parameter_shards"),
         ": parallel.parameter_shards = ", d.analysis.parameter_shards,
         " does not divide parallel.ranks_per_checkpoint = ", d.ranks_per_checkpoint,
         " (a checkpoint's team is cut into shard groups of parameter_shards ranks)");
  d.noise_vectors = r.str(*p, "parallel", "noise_vectors", "auto", false, {"auto", "keep", "recompute"});
  d.analysis.keep_noise_vectors = d.noise_vectors != "recompute";
}

}  // namespace

Deck parse_deck(const std::string& text, const std::string& name, const std::string& dir,
                const std::vector<std::string>& overrides) {
  Deck d;
  d.file = name;
  d.dir = dir;
  d.source_text = text;
  d.overrides = overrides;
  toml::table root;
  try {
    root = toml::parse(text, name);
  } catch (const toml::parse_error& e) {
    fail(name, ":", e.source().begin.line, ": TOML syntax error: ", e.description());
  }
  std::map<std::string, std::string> origin;
  for (const auto& o : overrides) apply_override(root, o, origin);
  const Reader r(name, origin);
  r.check_keys(root, "", {"run", "checkpoints", "data", "analysis", "precision", "parallel", "curvature", "landscape"});
  // In this order: [curvature] checks analysis.curvature_method.
  read_run_section(r, root, d);
  read_checkpoints_section(r, root, d);
  read_data_section(r, root, d);
  read_analysis_section(r, root, d);
  read_precision_section(r, root, d);
  read_curvature_section(r, root, d);
  read_landscape_section(r, root, d);
  read_parallel_section(r, root, d);
  std::ostringstream eff;
  eff << root;
  d.effective_text = eff.str();
  return d;
}

Deck load_deck(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  if (!in) fail(path, ": cannot open deck");
  std::stringstream ss;
  ss << in.rdbuf();
  const auto slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  return parse_deck(ss.str(), path, dir, overrides);
}

}  // namespace gnh
