// SPDX-License-Identifier: BSD-3-Clause
// op_probe: runs one op of the engine (kernels/ops.hpp) in float64 on given
// values and writes every mode's result, for the PyTorch oracle of the ops
// (tests/oracle/test_op_oracle.py). A test tool, not part of the user CLI.
//
//   op_probe DIR
// DIR/op.json names the op and its arguments: {"op": "rmsnorm", "N", "C",
// "bias"} | {"op": "rotary", "N", "T", "H", "D", "r", "base"} | {"op":
// "swiglu", "N", "F"}. DIR holds the inputs as raw little-endian float64:
// x, xd, xdd (N x in), p, pd (P), dy, dyd (N x out). Written into DIR:
// y, yd, ydd (the second-order forward: value, tangent, second plane along
// (xd, pd) with x'' = xdd), dx, dxd (the reverse and its tangent along
// (xd, pd, dyd)) and g, gd (the parameter gradient and its tangent).
#include <Kokkos_Core.hpp>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/ops.hpp"

using namespace gnh;
using Op = test::Op<double>;

namespace {

std::vector<double> read_raw(const std::string& path, std::size_t n) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open");
  std::vector<double> v(n);
  in.read(reinterpret_cast<char*>(v.data()), std::streamsize(n * sizeof(double)));
  if (std::size_t(in.gcount()) != n * sizeof(double))
    throw std::runtime_error(path + ": expected " + std::to_string(n) + " float64 values");
  return v;
}

void write_raw(const std::string& path, const View1<double>& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(h.data()), std::streamsize(h.extent(0) * sizeof(double)));
  if (!out) throw std::runtime_error(path + ": cannot write");
}

void load(const View1<double>& v, const std::vector<double>& x) {
  Kokkos::deep_copy(v, Kokkos::View<const double*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(x.data(), x.size()));
}

std::unique_ptr<Op> make_op(const nlohmann::json& a) {
  const std::string name = a.at("op");
  if (name == "rmsnorm")
    return std::make_unique<test::OpAdapter<kernels::RmsNormOp<double>>>(index_t(a.at("N")), index_t(a.at("C")),
                                                                         bool(a.at("bias")));
  if (name == "rotary")
    return std::make_unique<test::OpAdapter<kernels::RotaryOp<double>>>(index_t(a.at("N")), index_t(a.at("T")),
                                                                        index_t(a.at("H")), index_t(a.at("D")),
                                                                        index_t(a.at("r")), double(a.at("base")));
  if (name == "swiglu")
    return std::make_unique<test::OpAdapter<kernels::SwigluOp<double>>>(index_t(a.at("N")), index_t(a.at("F")));
  throw std::runtime_error("op_probe: unknown op " + name);
}

void probe(const std::string& dir) {
  std::ifstream in(dir + "/op.json");
  if (!in) throw std::runtime_error(dir + "/op.json: cannot open");
  const nlohmann::json args = nlohmann::json::parse(in);
  std::unique_ptr<Op> op = make_op(args);
  const auto nin = std::size_t(op->N * op->Cin), nout = std::size_t(op->N * op->Cout), np = std::size_t(op->P);
  test::Buf<double> x(op->N, op->Cin), y(op->N, op->Cout), dy(op->N, op->Cout), dx(op->N, op->Cin);
  test::Flat<double> p(op->P), g(op->P);
  load(x.v, read_raw(dir + "/x", nin));
  load(x.d, read_raw(dir + "/xd", nin));
  load(x.dd, read_raw(dir + "/xdd", nin));
  load(p.v, read_raw(dir + "/p", np));
  load(p.d, read_raw(dir + "/pd", np));
  load(dy.v, read_raw(dir + "/dy", nout));
  load(dy.d, read_raw(dir + "/dyd", nout));
  op->fwd_jet(y, x, p);
  write_raw(dir + "/y", y.v);
  write_raw(dir + "/yd", y.d);
  write_raw(dir + "/ydd", y.dd);
  op->rev_dual(dx, g, dy, x, p);
  write_raw(dir + "/dx", dx.v);
  write_raw(dir + "/dxd", dx.d);
  write_raw(dir + "/g", g.v);
  write_raw(dir + "/gd", g.d);
}

}  // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  if (argc != 2) {
    std::fprintf(stderr, "usage: op_probe DIR\n");
    return 2;
  }
  try {
    probe(argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "op_probe: %s\n", e.what());
    return 1;
  }
  return 0;
}
