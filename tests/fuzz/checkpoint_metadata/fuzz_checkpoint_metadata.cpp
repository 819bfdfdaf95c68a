// libFuzzer target: the checkpoint metadata reader of --load and mt-ckpt (io/checkpoint.h's
// CheckpointReader: root attributes, the tensor list with shapes, dtypes and checksums; the
// stored checksums against the values when the tensors are small) and the model and parallel
// configs it holds (from JSON, as lib/train/checkpointing.cpp reads them; the training config's
// checks live in lib/train/trainer.cpp, which the fuzz build does not compile). The input is the
// HDF5 file. A bad file is an mt::Error. Configs that are not JSON at all are left to nlohmann's
// parser (its parse_error is not the reader's to give).
// Tested by the fuzz smoke runs and the replay tests of tests/fuzz/CMakeLists.txt.
#include <hdf5.h>

#include <string>

#include "fuzz_support.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "parallel/parallel_config.h"

namespace {

constexpr int64_t kMaxScannedBytes = 1 << 20;  // the stored values are checked only for small files

template <typename FromJson>
void read_config(const std::string& text, FromJson&& from_json) {
  const nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return;
  mt::fuzz::refusals_only([&] { from_json(json); });
}

void read_checkpoint(const std::string& path) {
  const mt::io::CheckpointReader reader(path);
  int64_t bytes = 0;
  for (const auto& tensor : reader.tensors()) {
    FUZZ_CHECK(reader.has_tensor(tensor.name));
    FUZZ_CHECK(tensor.bytes >= 0);
    bytes += tensor.bytes;
  }
  if (bytes <= kMaxScannedBytes) reader.verify_checksums();
  read_config(reader.state().model_config, mt::model::config_from_json);
  read_config(reader.state().parallel_config, mt::parallel::parallel_config_from_json);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = [] { return H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr) >= 0; }();
  (void)quiet;
  const std::string path = mt::fuzz::write_scratch_file(mt::fuzz::as_text(data, size), ".h5");
  mt::fuzz::refusals_only([&] { read_checkpoint(path); });
  return 0;
}
