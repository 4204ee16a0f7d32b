// SPDX-License-Identifier: BSD-3-Clause
#include "analysis/settings.hpp"

#include <algorithm>

namespace gnh {

const char* to_string(Precision p) {
  switch (p) {
    case Precision::fp32:
      return "fp32";
    case Precision::tf32:
      return "tf32";
    case Precision::bf16_amp:
      return "bf16-amp";
    case Precision::fp64:
      return "fp64";
  }
  return "?";
}

const char* to_string(CurvatureMethod m) {
  return m == CurvatureMethod::forward_over_reverse ? "forward-over-reverse" : "second-order-forward";
}

const char* to_string(OperatorChoice o) {
  return o == OperatorChoice::hessian ? "hessian" : o == OperatorChoice::ggn ? "ggn" : "both";
}

const std::vector<std::string>& precision_names() {
  static const std::vector<std::string> names{"fp32", "tf32", "bf16-amp", "fp64"};
  return names;
}

const std::vector<std::string>& curvature_method_names() {
  static const std::vector<std::string> names{"second-order-forward", "forward-over-reverse"};
  return names;
}

std::optional<Precision> precision_named(const std::string& s) {
  for (Precision p : {Precision::fp32, Precision::tf32, Precision::bf16_amp, Precision::fp64})
    if (s == to_string(p)) return p;
  return std::nullopt;
}

std::optional<CurvatureMethod> curvature_method_named(const std::string& s) {
  for (CurvatureMethod m : {CurvatureMethod::second_order_forward, CurvatureMethod::forward_over_reverse})
    if (s == to_string(m)) return m;
  return std::nullopt;
}

std::string LandscapeDirection::name() const {
  switch (kind) {
    case LandscapeKind::gradient:
      return "gradient";
    case LandscapeKind::update:
      return "update";
    case LandscapeKind::eigenvector:
      return "eigenvector:" + std::to_string(index);
    case LandscapeKind::random:
      return "random:" + std::to_string(index);
  }
  return "?";
}

std::optional<LandscapeDirection> landscape_direction_named(const std::string& s) {
  if (s == "gradient") return LandscapeDirection{LandscapeKind::gradient, 0};
  if (s == "update") return LandscapeDirection{LandscapeKind::update, 0};
  for (const auto& [prefix, kind] : {std::pair<const char*, LandscapeKind>{"eigenvector:", LandscapeKind::eigenvector},
                                     {"random:", LandscapeKind::random}}) {
    const std::string p(prefix);
    if (s.compare(0, p.size(), p) != 0) continue;
    const std::string n = s.substr(p.size());
    if (n.empty() || n.size() > 6 || n.find_first_not_of("0123456789") != std::string::npos || n[0] == '0')
      return std::nullopt;
    return LandscapeDirection{kind, index_t(std::stoll(n))};
  }
  return std::nullopt;
}

std::vector<LandscapeDirection> LandscapeSettings::used() const {
  std::vector<LandscapeDirection> out;
  for (const auto* list : {&directions, &plane})
    for (const LandscapeDirection& d : *list)
      if (std::find(out.begin(), out.end(), d) == out.end()) out.push_back(d);
  return out;
}

index_t LandscapeSettings::random_count() const {
  index_t n = 0;
  for (const LandscapeDirection& d : used()) n += d.kind == LandscapeKind::random ? 1 : 0;
  return n;
}

index_t LandscapeSettings::top_eigenvector() const {
  index_t top = 0;
  for (const LandscapeDirection& d : used())
    if (d.kind == LandscapeKind::eigenvector) top = std::max(top, d.index);
  return top;
}

}  // namespace gnh
