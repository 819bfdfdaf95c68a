// Helpers shared by the layers (see layer_context.h).
#include "model/layers/layer_context.h"

#include "kernels/common/philox.h"

namespace mt::model {

uint64_t dropout_stream(const char* site, int layer) {
  return kernels::stream_id(site) + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(layer + 2);
}

int64_t param_offset(const ParamLayout& layout, const std::string& name) { return layout.find(name).offset; }

int64_t optional_param_offset(const ParamLayout& layout, const std::string& name) {
  const ParamEntry* entry = layout.try_find(name);
  return entry ? entry->offset : -1;
}

}  // namespace mt::model
