// SPDX-License-Identifier: BSD-3-Clause
#include "io/hdf5.hpp"

#include "io/files.hpp"

#include <cstdio>

#include "core/error.hpp"

namespace gnh::h5 {

void quiet() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

Handle& Handle::operator=(Handle&& o) noexcept {
  if (this != &o) {
    this->~Handle();
    id_ = o.id_;
    o.id_ = H5I_INVALID_HID;
  }
  return *this;
}

Handle::~Handle() {
  if (id_ >= 0) H5Idec_ref(id_);
  id_ = H5I_INVALID_HID;
}

File File::open_read(const std::string& path) {
  quiet();
  File f;
  f.path_ = path;
  require_not_directory(path, "this path");
  FILE* probe = std::fopen(path.c_str(), "rb");
  if (!probe) fail(path, ": cannot open (no such file or not readable)");
  std::fclose(probe);
  f.h_ = Handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!f.h_) fail(path, ": not a readable HDF5 file (truncated or corrupt?)");
  return f;
}

File File::create(const std::string& path) {
  quiet();
  File f;
  f.path_ = path;
  f.in_memory_ = true;
  // Built in memory (HDF5's core driver, no backing store) and written by
  // close() in one write_file, which names the OS's reason when the disk is
  // full or a quota is reached. HDF5 writing to such a disk itself reports
  // neither, and keeps a file it cannot flush open until its own shutdown,
  // where it crashed.
  const Handle fapl(H5Pcreate(H5P_FILE_ACCESS));
  if (!fapl || H5Pset_fapl_core(fapl.id(), std::size_t(1) << 20, 0) < 0)
    fail(path, ": cannot set up an HDF5 file in memory");
  f.h_ = Handle(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.id()));
  if (!f.h_) fail(path, ": cannot create HDF5 file");
  return f;
}

void File::close() {
  if (!h_) return;
  if (!in_memory_) {
    if (H5Fflush(h_.id(), H5F_SCOPE_LOCAL) < 0) fail(path_, ": flush failed");
    if (H5Fclose(h_.release()) < 0) fail(path_, ": close failed");
    return;
  }
  if (H5Fflush(h_.id(), H5F_SCOPE_LOCAL) < 0) fail(path_, ": cannot complete the HDF5 file in memory");
  const ssize_t n = H5Fget_file_image(h_.id(), nullptr, 0);
  if (n < 0) fail(path_, ": cannot read the HDF5 file's image from memory");
  std::string image(std::size_t(n), '\0');
  if (H5Fget_file_image(h_.id(), image.data(), image.size()) != n)
    fail(path_, ": cannot read the HDF5 file's image from memory");
  H5Fclose(h_.release());  // in memory: nothing to write, nothing to fail
  write_file(path_, image);
}

bool exists(hid_t loc, const std::string& name) { return H5Lexists(loc, name.c_str(), H5P_DEFAULT) > 0; }

Handle open_group(hid_t loc, const std::string& name, const std::string& where) {
  if (!exists(loc, name)) fail(where, ": missing group '", name, "'");
  Handle g(H5Gopen2(loc, name.c_str(), H5P_DEFAULT));
  if (!g) fail(where, ": cannot open group '", name, "'");
  return g;
}

Handle create_group(hid_t loc, const std::string& name, const std::string& where) {
  Handle g(H5Gcreate2(loc, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  if (!g) fail(where, ": cannot create group '", name, "'");
  return g;
}

std::vector<std::string> list_children(hid_t group, const std::string& where) {
  // H5Gget_info + H5Lget_name_by_idx exist unchanged in HDF5 1.10 and 1.12+.
  H5G_info_t info;
  if (H5Gget_info(group, &info) < 0) fail(where, ": cannot list members");
  std::vector<std::string> names;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t n = H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (n < 0) fail(where, ": cannot list members");
    std::string name(static_cast<std::size_t>(n) + 1, '\0');
    H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size(), H5P_DEFAULT);
    name.resize(static_cast<std::size_t>(n));
    names.push_back(name);
  }
  return names;
}

namespace {
Handle open_attr(hid_t obj, const std::string& name) {
  if (H5Aexists(obj, name.c_str()) <= 0) return Handle();
  return Handle(H5Aopen(obj, name.c_str(), H5P_DEFAULT));
}
}  // namespace

std::optional<std::int64_t> read_int_attr(hid_t obj, const std::string& name, const std::string& where) {
  Handle a = open_attr(obj, name);
  if (!a) return std::nullopt;
  Handle t(H5Aget_type(a.id()));
  if (H5Tget_class(t.id()) != H5T_INTEGER) fail(where, ": attribute '", name, "' is not an integer");
  std::int64_t v = 0;
  if (H5Aread(a.id(), H5T_NATIVE_INT64, &v) < 0) fail(where, ": cannot read attribute '", name, "'");
  return v;
}

std::vector<std::int64_t> read_int_array_attr(hid_t obj, const std::string& name, const std::string& where) {
  Handle a = open_attr(obj, name);
  if (!a) return {};
  Handle t(H5Aget_type(a.id()));
  if (H5Tget_class(t.id()) != H5T_INTEGER) fail(where, ": attribute '", name, "' is not an integer list");
  Handle space(H5Aget_space(a.id()));
  const hssize_t n = H5Sget_simple_extent_npoints(space.id());
  std::vector<std::int64_t> v(static_cast<std::size_t>(n > 0 ? n : 0));
  if (!v.empty() && H5Aread(a.id(), H5T_NATIVE_INT64, v.data()) < 0)
    fail(where, ": cannot read attribute '", name, "'");
  return v;
}

std::optional<double> read_double_attr(hid_t obj, const std::string& name, const std::string& where) {
  Handle a = open_attr(obj, name);
  if (!a) return std::nullopt;
  Handle t(H5Aget_type(a.id()));
  const H5T_class_t c = H5Tget_class(t.id());
  if (c != H5T_FLOAT && c != H5T_INTEGER) fail(where, ": attribute '", name, "' is not a number");
  double v = 0;
  if (H5Aread(a.id(), H5T_NATIVE_DOUBLE, &v) < 0) fail(where, ": cannot read attribute '", name, "'");
  return v;
}

std::optional<std::string> read_string_attr(hid_t obj, const std::string& name, const std::string& where) {
  Handle a = open_attr(obj, name);
  if (!a) return std::nullopt;
  Handle t(H5Aget_type(a.id()));
  if (H5Tget_class(t.id()) != H5T_STRING) fail(where, ": attribute '", name, "' is not a string");
  Handle space(H5Aget_space(a.id()));
  if (H5Sget_simple_extent_npoints(space.id()) != 1) fail(where, ": attribute '", name, "' is not a scalar string");
  if (H5Tis_variable_str(t.id()) > 0) {
    Handle mem(H5Tcopy(H5T_C_S1));
    H5Tset_size(mem.id(), H5T_VARIABLE);
    H5Tset_cset(mem.id(), H5Tget_cset(t.id()));
    char* s = nullptr;
    if (H5Aread(a.id(), mem.id(), &s) < 0) fail(where, ": cannot read attribute '", name, "'");
    std::string out = s ? s : "";
    H5free_memory(s);
    return out;
  }
  const std::size_t n = H5Tget_size(t.id());
  std::string buf(n, '\0');
  if (H5Aread(a.id(), t.id(), buf.data()) < 0) fail(where, ": cannot read attribute '", name, "'");
  buf.resize(buf.find('\0') == std::string::npos ? n : buf.find('\0'));
  return buf;
}

namespace {
void write_scalar_attr(hid_t obj, const std::string& name, hid_t type, const void* v) {
  if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
  Handle space(H5Screate(H5S_SCALAR));
  Handle a(H5Acreate2(obj, name.c_str(), type, space.id(), H5P_DEFAULT, H5P_DEFAULT));
  if (!a || H5Awrite(a.id(), type, v) < 0) fail("HDF5: cannot write attribute '", name, "'");
}
Handle utf8_vlen_type() {
  Handle t(H5Tcopy(H5T_C_S1));
  H5Tset_size(t.id(), H5T_VARIABLE);
  H5Tset_cset(t.id(), H5T_CSET_UTF8);
  return t;
}
}  // namespace

void write_attr(hid_t obj, const std::string& name, std::int64_t v) {
  write_scalar_attr(obj, name, H5T_NATIVE_INT64, &v);
}
void write_attr(hid_t obj, const std::string& name, double v) { write_scalar_attr(obj, name, H5T_NATIVE_DOUBLE, &v); }
void write_attr(hid_t obj, const std::string& name, const std::string& v) {
  Handle t = utf8_vlen_type();
  const char* p = v.c_str();
  write_scalar_attr(obj, name, t.id(), &p);
}
void write_attr(hid_t obj, const std::string& name, const std::vector<std::string>& v) {
  if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
  Handle t = utf8_vlen_type();
  const hsize_t n = v.size();
  Handle space(H5Screate_simple(1, &n, nullptr));
  std::vector<const char*> ptrs;
  for (const auto& s : v) ptrs.push_back(s.c_str());
  Handle a(H5Acreate2(obj, name.c_str(), t.id(), space.id(), H5P_DEFAULT, H5P_DEFAULT));
  // An empty list is the attribute's (0)-shaped dataspace alone: nothing to write.
  if (!a || (!v.empty() && H5Awrite(a.id(), t.id(), ptrs.data()) < 0))
    fail("HDF5: cannot write attribute '", name, "'");
}

void write_attr(hid_t obj, const std::string& name, const std::vector<std::int64_t>& v) {
  if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
  const hsize_t n = v.size();
  Handle space(H5Screate_simple(1, &n, nullptr));
  Handle a(H5Acreate2(obj, name.c_str(), H5T_NATIVE_INT64, space.id(), H5P_DEFAULT, H5P_DEFAULT));
  if (!a || (!v.empty() && H5Awrite(a.id(), H5T_NATIVE_INT64, v.data()) < 0))
    fail("HDF5: cannot write attribute '", name, "'");
}

std::vector<std::int64_t> dataset_shape(hid_t dset) {
  Handle space(H5Dget_space(dset));
  const int rank = H5Sget_simple_extent_ndims(space.id());
  if (rank < 0) return {};
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  H5Sget_simple_extent_dims(space.id(), dims.data(), nullptr);
  return std::vector<std::int64_t>(dims.begin(), dims.end());
}

namespace {
void write_raw(hid_t loc, const std::string& name, hid_t type, const void* data,
               const std::vector<std::int64_t>& shape) {
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
  Handle d(H5Dcreate2(loc, name.c_str(), type, space.id(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  if (!d) fail("HDF5: cannot create dataset '", name, "'");
  std::int64_t n = 1;
  for (auto s : shape) n *= s;
  if (n > 0 && H5Dwrite(d.id(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
    fail("HDF5: cannot write dataset '", name, "'");
}
}  // namespace

void write_dataset(hid_t loc, const std::string& name, const std::vector<double>& v) {
  write_raw(loc, name, H5T_NATIVE_DOUBLE, v.data(), {static_cast<std::int64_t>(v.size())});
}

void write_dataset(hid_t loc, const std::string& name, const std::vector<double>& v,
                   const std::vector<std::int64_t>& shape) {
  write_raw(loc, name, H5T_NATIVE_DOUBLE, v.data(), shape);
}

void write_dataset(hid_t loc, const std::string& name, const std::vector<float>& v) {
  write_raw(loc, name, H5T_NATIVE_FLOAT, v.data(), {static_cast<std::int64_t>(v.size())});
}

void write_dataset(hid_t loc, const std::string& name, const std::vector<float>& v,
                   const std::vector<std::int64_t>& shape) {
  write_raw(loc, name, H5T_NATIVE_FLOAT, v.data(), shape);
}

void write_dataset(hid_t loc, const std::string& name, const std::vector<std::string>& v) {
  Handle t = utf8_vlen_type();
  std::vector<const char*> ptrs;
  for (const auto& s : v) ptrs.push_back(s.c_str());
  write_raw(loc, name, t.id(), ptrs.data(), {static_cast<std::int64_t>(v.size())});
}

void write_dataset(hid_t loc, const std::string& name, const std::vector<std::int64_t>& v,
                   const std::vector<std::int64_t>& shape) {
  write_raw(loc, name, H5T_NATIVE_INT64, v.data(), shape);
}

}  // namespace gnh::h5
