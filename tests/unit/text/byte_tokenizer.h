// A tokenizer for the preprocess suites (tests/unit/text/test_preprocess.cpp,
// tests/mpi/test_partitions.cpp): every byte is its own id; "<|endoftext|>" is 256 when special
// tokens are allowed.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "text/tokenizer.h"

namespace mt::testing {

class ByteTokenizer : public text::Tokenizer {
 public:
  void encode(std::string_view text, std::vector<int32_t>& out, bool allow_special) const override {
    const std::string_view special = "<|endoftext|>";
    for (size_t i = 0; i < text.size(); ++i) {
      if (allow_special && text.substr(i, special.size()) == special) {
        out.push_back(256);
        i += special.size() - 1;
      } else {
        out.push_back(static_cast<unsigned char>(text[i]));
      }
    }
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::string text;
    for (int32_t id : ids) text += token_bytes(id);
    return text;
  }
  std::string token_bytes(int32_t id) const override { return id == 256 ? "<|endoftext|>" : std::string(1, char(id)); }
  int64_t vocab_size() const override { return 257; }
  std::optional<int32_t> eod_id() const override { return 256; }
  std::optional<int32_t> special_token_id(std::string_view text) const override {
    return text == "<|endoftext|>" ? std::optional<int32_t>(256) : std::nullopt;
  }
  std::string name() const override { return "bytes"; }
  std::string hash() const override { return "0"; }
};

}  // namespace mt::testing
