// SPDX-License-Identifier: BSD-3-Clause
// Thin RAII layer over HDF5's C API: handles close themselves, and every failure
// becomes a gnh::Error naming the file and object. HDF5's own error-stack
// printing is switched off (see quiet()); our messages replace it.
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gnh::h5 {

void quiet();  // disables HDF5's automatic error printing (idempotent)

class Handle {
 public:
  Handle() = default;
  explicit Handle(hid_t id) : id_(id) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& o) noexcept : id_(o.id_) { o.id_ = H5I_INVALID_HID; }
  Handle& operator=(Handle&& o) noexcept;
  ~Handle();
  hid_t id() const { return id_; }
  explicit operator bool() const { return id_ >= 0; }
  hid_t release() {
    const hid_t id = id_;
    id_ = H5I_INVALID_HID;
    return id;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
};

class File {
 public:
  static File open_read(const std::string& path);
  // A new file, built in memory and written to path by close() (truncating
  // it); dropped without a write if close() is never called.
  static File create(const std::string& path);
  const std::string& path() const { return path_; }
  hid_t id() const { return h_.id(); }
  // Flushes and closes; a created file is written to its path here. Throws on
  // failure, naming the path and the OS's reason (a silent failed close loses data).
  void close();

 private:
  std::string path_;
  Handle h_;
  bool in_memory_ = false;
};

bool exists(hid_t loc, const std::string& name);
Handle open_group(hid_t loc, const std::string& name, const std::string& where);
Handle create_group(hid_t loc, const std::string& name, const std::string& where);
std::vector<std::string> list_children(hid_t group, const std::string& where);

// Attributes. `where` names the file/object in error messages.
std::optional<std::int64_t> read_int_attr(hid_t obj, const std::string& name, const std::string& where);
std::vector<std::int64_t> read_int_array_attr(hid_t obj, const std::string& name, const std::string& where);
std::optional<double> read_double_attr(hid_t obj, const std::string& name, const std::string& where);
std::optional<std::string> read_string_attr(hid_t obj, const std::string& name, const std::string& where);
void write_attr(hid_t obj, const std::string& name, std::int64_t v);
void write_attr(hid_t obj, const std::string& name, double v);
void write_attr(hid_t obj, const std::string& name, const std::string& v);
void write_attr(hid_t obj, const std::string& name, const std::vector<std::string>& v);
void write_attr(hid_t obj, const std::string& name, const std::vector<std::int64_t>& v);

// Datasets.
std::vector<std::int64_t> dataset_shape(hid_t dset);
void write_dataset(hid_t loc, const std::string& name, const std::vector<double>& v);
void write_dataset(hid_t loc, const std::string& name, const std::vector<double>& v,
                   const std::vector<std::int64_t>& shape);
void write_dataset(hid_t loc, const std::string& name, const std::vector<float>& v);
void write_dataset(hid_t loc, const std::string& name, const std::vector<float>& v,
                   const std::vector<std::int64_t>& shape);
void write_dataset(hid_t loc, const std::string& name, const std::vector<std::string>& v);
void write_dataset(hid_t loc, const std::string& name, const std::vector<std::int64_t>& v,
                   const std::vector<std::int64_t>& shape);

}  // namespace gnh::h5
