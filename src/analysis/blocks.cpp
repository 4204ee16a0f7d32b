// SPDX-License-Identifier: BSD-3-Clause
#include "analysis/blocks.hpp"

#include <stdexcept>

namespace gnh {

std::vector<Partition> parameter_partitions(const ParamLayout& layout) {
  Partition tensor{"tensor", {}, {}}, layer{"layer", {}, {}};
  for (const TensorInfo& t : layout.tensors()) {
    tensor.names.push_back(t.name);
    tensor.offsets.push_back(t.offset);
  }
  tensor.offsets.push_back(layout.size());
  // The layer blocks start where their first tensor does: the embedding, each
  // layer's first tensor, the final norm's weight.
  layer.names.push_back("embed");
  layer.offsets.push_back(layout.wte);
  for (std::size_t i = 0; i < layout.blocks.size(); ++i) {
    layer.names.push_back("h." + std::to_string(i));
    layer.offsets.push_back(layout.blocks[i].first);
  }
  layer.names.push_back("head");
  layer.offsets.push_back(layout.lnf_w);
  layer.offsets.push_back(layout.size());
  for (const Partition* p : {&tensor, &layer})
    for (std::size_t b = 0; b + 1 < p->offsets.size(); ++b)
      if (p->offsets[b] >= p->offsets[b + 1] || p->offsets.front() != 0)
        throw std::logic_error("gnh::parameter_partitions: the " + p->name + " blocks are not contiguous and ordered");
  return {tensor, layer};
}

}  // namespace gnh
