// SPDX-License-Identifier: BSD-3-Clause
#include "analysis/settings.hpp"

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

}  // namespace gnh
