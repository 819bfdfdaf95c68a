// libFuzzer target: the safetensors reader (io/safetensors.h) of mt-ckpt import. A bad file is an
// mt::Error naming it; a file that opens gives every tensor's values (its element count of them)
// from inside the file.
// Tested by the fuzz smoke runs and the replay tests of tests/fuzz/CMakeLists.txt.
#include <string>

#include "fuzz_support.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = mt::fuzz::write_scratch_file(mt::fuzz::as_text(data, size), ".safetensors");
  mt::fuzz::refusals_only([&] {
    const mt::io::SafetensorsReader reader(path);
    for (const auto& entry : reader.entries()) {
      FUZZ_CHECK(entry.begin >= 0 && entry.begin <= entry.end && entry.end <= static_cast<int64_t>(size));
      FUZZ_CHECK(reader.find(entry.name) != nullptr);
      FUZZ_CHECK(static_cast<int64_t>(reader.read(entry.name).size()) == entry.elements());
    }
  });
  return 0;
}
