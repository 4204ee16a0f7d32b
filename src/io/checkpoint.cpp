// SPDX-License-Identifier: BSD-3-Clause
#include "io/checkpoint.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "core/error.hpp"
#include "core/sha256.hpp"
#include "io/hdf5.hpp"
#include "model/layout.hpp"

namespace gnh {
namespace {

// The attributes of /config, each named in the message when missing or of
// the wrong kind.
struct ConfigReader {
  hid_t g;
  std::string where;
  int integer(const char* key) const {
    auto v = h5::read_int_attr(g, key, where);
    if (!v) fail(where, " lacks attribute '", key, "'");
    return static_cast<int>(*v);
  }
  double real(const char* key) const {
    auto v = h5::read_double_attr(g, key, where);
    if (!v) fail(where, " lacks attribute '", key, "'");
    return *v;
  }
  bool flag(const char* key) const { return integer(key) != 0; }
  std::string text(const char* key) const {
    auto v = h5::read_string_attr(g, key, where);
    if (!v) fail(where, " lacks attribute '", key, "'");
    return *v;
  }
  Gelu gelu(const char* key) const {
    const std::string v = text(key);
    // Hugging Face's hidden_act names: gelu is exact, gelu_new the tanh form.
    if (v == "erf" || v == "gelu") return Gelu::erf;
    if (v == "tanh" || v == "gelu_new") return Gelu::tanh;
    fail(where, ": attribute ", key, " = \"", v, "\" (expected \"erf\" or \"tanh\", or gelu / gelu_new)");
  }
};

void read_nanogpt(const ConfigReader& r, ModelConfig& c) {
  c.n_layer = r.integer("n_layer");
  c.n_head = r.integer("n_head");
  c.n_embd = r.integer("n_embd");
  c.block_size = r.integer("block_size");
  c.vocab_size = r.integer("vocab_size");
  c.bias = r.flag("bias");
  c.tie_embeddings = r.flag("tie_embeddings");
  c.gelu = r.gelu("gelu");
  c.ln_eps = r.real("ln_eps");
}

// SPEC §11's hyperparameters, under Hugging Face's names.
void read_hf(const ConfigReader& r, ModelConfig& c) {
  c.vocab_size = r.integer("vocab_size");
  c.n_embd = r.integer("hidden_size");
  c.intermediate = r.integer("intermediate_size");
  c.n_layer = r.integer("num_hidden_layers");
  c.n_head = r.integer("num_attention_heads");
  c.block_size = r.integer("max_position_embeddings");
  c.tie_embeddings = r.flag("tie_word_embeddings");
  c.bias = false;
  if (c.family == Family::llama) {
    c.n_kv_head = r.integer("num_key_value_heads");
    c.head_dim = r.integer("head_dim");
    c.ln_eps = r.real("rms_norm_eps");
    c.rope_theta = r.real("rope_theta");
    c.qkv_bias = r.flag("qkv_bias");
    c.o_bias = r.flag("o_bias");
    return;
  }
  c.head_dim = c.n_head > 0 ? c.n_embd / c.n_head : 0;
  c.rotary_pct = r.real("rotary_pct");
  c.rope_theta = r.real("rotary_emb_base");
  c.ln_eps = r.real("layer_norm_eps");
  c.parallel_residual = r.flag("use_parallel_residual");
  c.gelu = r.gelu("hidden_act");
  c.qkv_bias = r.flag("attention_bias");
}

ModelConfig read_config(const h5::File& f) {
  const std::string& path = f.path();
  auto format = h5::read_string_attr(f.id(), "format", path);
  if (!format || *format != "gnh-checkpoint")
    fail(path,
         ": not a gnh checkpoint (root attribute format=\"gnh-checkpoint\" missing); "
         "convert PyTorch files with apps/gnh-convert");
  auto version = h5::read_int_attr(f.id(), "format_version", path);
  if (!version || *version != 1)
    fail(path, ": unsupported checkpoint format_version ", version ? *version : -1, " (expected 1)");
  h5::Handle g = h5::open_group(f.id(), "config", path);
  const std::string where = path + ": /config";
  ConfigReader r{g.id(), where};
  ModelConfig c;
  // SPEC §11: family "nanogpt" when absent (files written before it).
  const std::string family = h5::read_string_attr(g.id(), "family", where).value_or("nanogpt");
  if (!family_from_string(family, c.family))
    fail(where, ": attribute family = \"", family, "\" (expected \"nanogpt\", \"llama\" or \"gpt-neox\")");
  if (c.family == Family::nanogpt) read_nanogpt(r, c);
  else read_hf(r, c);
  c.validate(path);
  return c;
}

}  // namespace

ModelConfig read_checkpoint_config(const std::string& path) {
  h5::File f = h5::File::open_read(path);
  return read_config(f);
}

std::string params_sha256(const std::vector<float>& params) {
  static_assert(sizeof(float) == 4, "float32 expected");
  Sha256 h;
  // Hash the little-endian bytes (the host order on every supported platform).
  h.update(params.data(), params.size() * sizeof(float));
  return h.hexdigest();
}

namespace {

// Every tensor of the layout under `group` (named `prefix` + name in
// messages): present, float32, the layout's shape; with `values`, read into
// it and checked finite (and >= 0 when nonnegative).
void read_tensors(hid_t group, const ParamLayout& layout, const std::string& path, const std::string& prefix,
                  std::vector<float>* values, bool nonnegative = false) {
  if (values) values->resize(static_cast<std::size_t>(layout.size()));
  for (const auto& t : layout.tensors()) {
    const std::string where = path + ": tensor '" + prefix + t.name + "'";
    if (!h5::exists(group, t.name)) fail(where, " is missing");
    h5::Handle d(H5Dopen2(group, t.name.c_str(), H5P_DEFAULT));
    if (!d) fail(where, " cannot be opened");
    h5::Handle type(H5Dget_type(d.id()));
    if (H5Tget_class(type.id()) != H5T_FLOAT || H5Tget_size(type.id()) != 4) fail(where, " is not float32");
    const auto shape = h5::dataset_shape(d.id());
    if (shape != t.shape) {
      std::string got, want;
      for (auto s : shape) got += (got.empty() ? "" : ", ") + std::to_string(s);
      for (auto s : t.shape) want += (want.empty() ? "" : ", ") + std::to_string(s);
      fail(where, " has shape (", got, "), expected (", want, ")");
    }
    if (!values) continue;
    float* dst = values->data() + t.offset;
    if (H5Dread(d.id(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, dst) < 0)
      fail(where, " cannot be read (truncated file?)");
    std::int64_t bad = 0, first = -1;
    for (std::int64_t i = 0; i < t.size; ++i)
      if (!std::isfinite(dst[i]) || (nonnegative && dst[i] < 0)) {
        if (first < 0) first = i;
        ++bad;
      }
    if (bad > 0)
      fail(where, " holds ", bad, nonnegative ? " negative or non-finite" : " non-finite",
           " value(s), first at flat index ", first, " (", dst[first], ")");
  }
}

// The header of an open file; with `values`, also reads every tensor into params.
CheckpointHeader read_header(const h5::File& f, const std::string& path, std::vector<float>* values) {
  CheckpointHeader h;
  h.path = path;
  h.config = read_config(f);
  h.source_file = h5::read_string_attr(f.id(), "source_file", path).value_or("");
  h.source_sha256 = h5::read_string_attr(f.id(), "source_sha256", path).value_or("");
  h.iter_num = h5::read_int_attr(f.id(), "iter_num", path);
  h.stored_sha256 = h5::read_string_attr(f.id(), "param_sha256", path);
  if (h.stored_sha256 &&
      (h.stored_sha256->size() != 64 || h.stored_sha256->find_first_not_of("0123456789abcdef") != std::string::npos))
    fail(path, ": root attribute param_sha256 = \"", *h.stored_sha256, "\" is not 64 lowercase hex digits");

  const ParamLayout layout(h.config);
  h.n_params = layout.size();
  h5::Handle params = h5::open_group(f.id(), "params", path);
  std::set<std::string> expected;
  for (const auto& t : layout.tensors()) expected.insert(t.name);
  for (const auto& name : h5::list_children(params.id(), path + ": /params"))
    if (!expected.count(name)) fail(path, ": unknown tensor '/params/", name, "' for config ", h.config.describe());

  read_tensors(params.id(), layout, path, "", values);
  return h;
}

}  // namespace

CheckpointHeader read_checkpoint_header(const std::string& path) {
  h5::File f = h5::File::open_read(path);
  CheckpointHeader h = read_header(f, path, nullptr);
  f.close();
  return h;
}

namespace {
void read_flat(hid_t group, const TensorInfo& t, hsize_t a, hsize_t b, float* dst, const std::string& where);

// With tensors, exp_avg_sq's values [lo, hi) (hi < 0: all of them); a slice
// read by hyperslab from the tensors it crosses, every tensor's type and
// shape checked all the same.
std::optional<AdamState> read_adam(const std::string& path, bool tensors, std::int64_t lo = 0, std::int64_t hi = -1) {
  h5::File f = h5::File::open_read(path);
  if (!h5::exists(f.id(), "optimizer")) return std::nullopt;
  const ModelConfig cfg = read_config(f);
  const ParamLayout layout(cfg);
  h5::Handle o = h5::open_group(f.id(), "optimizer", path);
  const std::string where = path + ": /optimizer";
  AdamState s;
  const auto step = h5::read_int_attr(o.id(), "step", where);
  if (!step || *step < 1) fail(where, ": attribute step must be an integer >= 1");
  s.step = *step;
  auto real = [&](const char* name, double lo, double hi) {
    const auto v = h5::read_double_attr(o.id(), name, where);
    if (!v || !std::isfinite(*v) || *v < lo || *v >= hi)
      fail(where, ": attribute ", name, " must be a finite number in [", lo, ", ", hi, ")");
    return *v;
  };
  s.beta1 = real("beta1", 0.0, 1.0);
  s.beta2 = real("beta2", 0.0, 1.0);
  s.eps = real("eps", 0.0, HUGE_VAL);
  if (h5::read_double_attr(o.id(), "lr", where)) s.lr = real("lr", 0.0, HUGE_VAL);
  if (tensors && hi < 0) {
    h5::Handle v = h5::open_group(o.id(), "exp_avg_sq", path);
    read_tensors(v.id(), layout, path, "/optimizer/exp_avg_sq/", &s.exp_avg_sq, true);
  } else if (tensors) {
    if (lo < 0 || lo > hi || hi > layout.size())
      fail(path, ": a slice [", lo, ", ", hi, ") of /optimizer/exp_avg_sq of ", layout.size(), " values");
    h5::Handle v = h5::open_group(o.id(), "exp_avg_sq", path);
    read_tensors(v.id(), layout, path, "/optimizer/exp_avg_sq/", nullptr, true);
    s.exp_avg_sq.resize(std::size_t(hi - lo));
    for (const TensorInfo& t : layout.tensors()) {
      const std::int64_t a = std::max(lo, t.offset), b = std::min(hi, t.offset + t.size);
      if (a >= b) continue;
      const std::string where = path + ": tensor '/optimizer/exp_avg_sq/" + t.name + "'";
      float* dst = s.exp_avg_sq.data() + (a - lo);
      read_flat(v.id(), t, hsize_t(a - t.offset), hsize_t(b - t.offset), dst, where);
      for (std::int64_t i = 0; i < b - a; ++i)
        if (dst[i] < 0) fail(where, " holds a negative value at flat index ", a - t.offset + i, " (", dst[i], ")");
    }
  }
  f.close();
  return s;
}
}  // namespace

std::optional<AdamState> read_adam_state(const std::string& path) { return read_adam(path, true); }
std::optional<AdamState> read_adam_hyperparameters(const std::string& path) { return read_adam(path, false); }
std::optional<AdamState> read_adam_state_slice(const std::string& path, std::int64_t lo, std::int64_t hi) {
  return read_adam(path, true, lo, hi);
}

std::vector<double> adam_preconditioner(const AdamState& s, const ModelConfig& cfg, const std::string& path,
                                        std::int64_t lo) {
  const ParamLayout layout(cfg);
  const std::int64_t hi = lo + std::int64_t(s.exp_avg_sq.size());
  if (lo < 0 || hi > layout.size())
    fail(path, ": /optimizer/exp_avg_sq values [", lo, ", ", hi, ") beyond the model's ", layout.size());
  const double correction = 1.0 - std::pow(s.beta2, double(s.step));
  std::vector<double> P(s.exp_avg_sq.size());
  for (const auto& t : layout.tensors())
    for (std::int64_t i = std::max<std::int64_t>(0, lo - t.offset); i < std::min(t.size, hi - t.offset); ++i) {
      const double vhat = double(s.exp_avg_sq[std::size_t(t.offset + i - lo)]) / correction;
      const double p = 1.0 / (std::sqrt(vhat) + s.eps);
      if (!std::isfinite(p))
        fail(path, ": the AdamW preconditioner 1/(sqrt(v_hat) + eps) of tensor '", t.name, "' is not finite at index ",
             i, " (exp_avg_sq ", s.exp_avg_sq[std::size_t(t.offset + i - lo)], ", eps ", s.eps, ")");
      P[std::size_t(t.offset + i - lo)] = p;
    }
  return P;
}

namespace {

// The flat range [a, b) of a C-ordered dataset of extents dims[d..] (the
// extents before d fixed by start), as hyperslab blocks: a partial leading
// row, whole rows, a partial trailing row, each partial row in turn cut the
// same way one extent down. emit() selects start/count as they stand.
template <class Emit>
void flat_blocks(const std::vector<hsize_t>& dims, std::size_t d, hsize_t a, hsize_t b, std::vector<hsize_t>& start,
                 std::vector<hsize_t>& count, Emit&& emit) {
  if (a >= b) return;
  if (d + 1 == dims.size()) {
    start[d] = a;
    count[d] = b - a;
    emit();
    return;
  }
  hsize_t inner = 1;
  for (std::size_t k = d + 1; k < dims.size(); ++k) inner *= dims[k];
  auto rows = [&](hsize_t r0, hsize_t r1) {  // whole rows [r0, r1)
    if (r0 >= r1) return;
    start[d] = r0;
    count[d] = r1 - r0;
    for (std::size_t k = d + 1; k < dims.size(); ++k) start[k] = 0, count[k] = dims[k];
    emit();
  };
  auto part = [&](hsize_t r, hsize_t x0, hsize_t x1) {  // row r, its flat [x0, x1)
    start[d] = r;
    count[d] = 1;
    flat_blocks(dims, d + 1, x0, x1, start, count, emit);
  };
  const hsize_t r0 = a / inner, r1 = b / inner;
  if (r0 == (b - 1) / inner && (a % inner != 0 || b % inner != 0)) return part(r0, a % inner, b - r0 * inner);
  hsize_t first = r0;
  if (a % inner != 0) part(r0, a % inner, inner), ++first;
  rows(first, r1);
  if (b % inner != 0) part(r1, 0, b % inner);
}

// Values [a, b) of the flat (C-ordered) dataset `name` of group into dst,
// checked finite; `where` names the tensor in messages.
void read_flat(hid_t group, const TensorInfo& t, hsize_t a, hsize_t b, float* dst, const std::string& where) {
  h5::Handle d(H5Dopen2(group, t.name.c_str(), H5P_DEFAULT));
  if (!d) fail(where, " cannot be opened");
  h5::Handle space(H5Dget_space(d.id()));
  std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
  std::vector<hsize_t> start(dims.size()), count(dims.size());
  bool first = true;
  flat_blocks(dims, 0, a, b, start, count, [&] {
    if (H5Sselect_hyperslab(space.id(), first ? H5S_SELECT_SET : H5S_SELECT_OR, start.data(), nullptr, count.data(),
                            nullptr) < 0)
      fail(where, ": cannot select values ", a, " to ", b);
    first = false;
  });
  const hsize_t n = b - a;
  h5::Handle memory(H5Screate_simple(1, &n, nullptr));
  if (H5Dread(d.id(), H5T_NATIVE_FLOAT, memory.id(), space.id(), H5P_DEFAULT, dst) < 0)
    fail(where, " cannot be read (truncated file?)");
  for (hsize_t i = 0; i < n; ++i)
    if (!std::isfinite(dst[i])) fail(where, " holds a non-finite value at flat index ", a + i, " (", dst[i], ")");
}

}  // namespace

std::vector<float> read_param_slice(const std::string& path, std::int64_t lo, std::int64_t hi) {
  h5::File f = h5::File::open_read(path);
  const CheckpointHeader h = read_header(f, path, nullptr);
  if (lo < 0 || lo > hi || hi > h.n_params)
    fail(path, ": a slice [", lo, ", ", hi, ") of a parameter vector of ", h.n_params, " values");
  h5::Handle params = h5::open_group(f.id(), "params", path);
  std::vector<float> out(static_cast<std::size_t>(hi - lo));
  const ParamLayout layout(h.config);
  for (const TensorInfo& t : layout.tensors()) {
    const std::int64_t a = std::max(lo, t.offset), b = std::min(hi, t.offset + t.size);
    if (a < b)
      read_flat(params.id(), t, hsize_t(a - t.offset), hsize_t(b - t.offset), out.data() + (a - lo),
                path + ": tensor '" + t.name + "'");
  }
  f.close();
  return out;
}

std::string verify_param_hash(const std::string& path, std::int64_t block) {
  h5::File f = h5::File::open_read(path);
  const CheckpointHeader h = read_header(f, path, nullptr);
  h5::Handle params = h5::open_group(f.id(), "params", path);
  const ParamLayout layout(h.config);
  std::int64_t most = 1;
  for (const TensorInfo& t : layout.tensors()) most = std::max(most, std::min(block, t.size));
  std::vector<float> buffer(static_cast<std::size_t>(most));
  Sha256 hash;
  for (const TensorInfo& t : layout.tensors())
    for (std::int64_t a = 0; a < t.size; a += block) {
      const std::int64_t b = std::min(t.size, a + block);
      read_flat(params.id(), t, hsize_t(a), hsize_t(b), buffer.data(), path + ": tensor '" + t.name + "'");
      hash.update(buffer.data(), std::size_t(b - a) * sizeof(float));
    }
  f.close();
  const std::string got = hash.hexdigest();
  if (h.stored_sha256 && *h.stored_sha256 != got)
    fail(path, ": the parameters read hash to ", got.substr(0, 16), "..., not to the file's param_sha256 ",
         h.stored_sha256->substr(0, 16), "...: the file was changed after conversion; convert it again");
  return got;
}

Checkpoint read_checkpoint(const std::string& path) {
  h5::File f = h5::File::open_read(path);
  Checkpoint ck;
  static_cast<CheckpointHeader&>(ck) = read_header(f, path, &ck.params);
  f.close();
  ck.param_sha256 = params_sha256(ck.params);
  if (ck.stored_sha256 && *ck.stored_sha256 != ck.param_sha256)
    fail(path, ": the parameters read hash to ", ck.param_sha256.substr(0, 16), "..., not to the file's param_sha256 ",
         ck.stored_sha256->substr(0, 16), "...: the file was changed after conversion; convert it again");
  return ck;
}

}  // namespace gnh
